#include "models/nn/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "models/nn/init.h"
#include "tensor/ops.h"

namespace strata::models::nn {

namespace {
thread_local bool sp_paused = false;
}  // namespace

SequenceParallelPause::SequenceParallelPause() : was_(sp_paused) {
  sp_paused = true;
}
SequenceParallelPause::~SequenceParallelPause() {
  sp_paused = was_;
}

bool TensorParallel::sp() const {
  return enabled() && sequence_parallel && !sp_paused;
}

Variable TensorParallel::enter(const Variable& x) const {
  if (!enabled()) return x;
  return sp() ? autograd::gather_from_sequence_region(x, group)
              : autograd::copy_to_tp_region(x, group);
}

std::vector<Variable> TensorParallel::enter_columns(
    const Variable& x, const autograd::GatheredConsumers& consumers) const {
  if (!sp()) return consumers(enter(x));
  return autograd::with_gathered_sequence(x, group, consumers);
}

Variable TensorParallel::enter_columns(
    const Variable& x, const std::function<Variable(const Variable&)>& consumer) const {
  return enter_columns(x, [&](const Variable& in) { return std::vector<Variable>{consumer(in)}; })
      .front();
}

Variable TensorParallel::exit(const Variable& partial) const {
  if (!enabled()) return partial;
  return sp() ? autograd::reduce_scatter_to_sequence_region(partial, group)
              : autograd::reduce_from_tp_region(partial, group);
}

Variable TensorParallel::replicated(const Variable& param) const {
  return sp() ? autograd::copy_to_tp_region(param, group) : param;
}

Shape shard_shape(const Shape& full, const ShardSpec& spec, int size) {
  if (spec.dim < 0 || size == 1) return full;
  STRATA_CHECK(full[spec.dim] % (spec.blocks * size) == 0,
               "dim {} of {} does not split into {} blocks over tp = {}", spec.dim, full.str(),
               spec.blocks, size);
  Shape s = full;
  s[spec.dim] = full[spec.dim] / size;
  return s;
}

void read_shard(const Shape& full, const ShardSpec& spec, int rank, int size, const ReadRange& read,
                Tensor dst, int64_t chunk) {
  STRATA_CHECK(dst.dtype() == DType::F32 && dst.is_contiguous() && dst.device().is_cpu(),
               "read_shard into a {} tensor", dtype_name(dst.dtype()));
  if (spec.dim < 0 || size == 1) {
    read(0, dst);
    return;
  }
  // In row-major order the slice is, for each index `o` over the dimensions before spec.dim and
  // each block b, one contiguous run of piece * inner elements (Note [Tensor-parallel shards]).
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < spec.dim; ++d) outer *= full[d];
  for (int d = spec.dim + 1; d < full.ndim(); ++d) inner *= full[d];
  const int64_t len = full[spec.dim], block = len / spec.blocks, piece = block / size;
  const int64_t run = piece * inner, row = len * inner, local_row = spec.blocks * run;
  STRATA_CHECK(dst.numel() == outer * local_row, "a slice of {} elements into {}",
               outer * local_row, dst.numel());
  auto src_at = [&](int64_t o, int64_t b) { return o * row + (b * block + rank * piece) * inner; };
  auto dst_at = [&](int64_t o, int64_t b) { return o * local_row + b * run; };
  if (outer == 1 || run >= chunk) {  // a row shard: each run read straight into place
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t b = 0; b < spec.blocks; ++b)
        read(src_at(o, b), dst.narrow(0, dst_at(o, b), run));
    return;
  }
  // A column shard's runs are short and strided: whole rows, a bounded chunk at a time, and the
  // runs copied out of it.
  const int64_t rows = std::max<int64_t>(1, chunk / row);
  Tensor rows_read = Tensor::empty({std::min(rows, outer) * row});
  const float* from = rows_read.data<float>();
  float* to = dst.data<float>();
  for (int64_t o0 = 0; o0 < outer; o0 += rows) {
    const int64_t n = std::min(rows, outer - o0);
    read(o0 * row, rows_read.narrow(0, 0, n * row));
    for (int64_t o = o0; o < o0 + n; ++o)
      for (int64_t b = 0; b < spec.blocks; ++b)
        std::memcpy(to + dst_at(o, b), from + src_at(o, b) - o0 * row,
                    static_cast<size_t>(run) * sizeof(float));
  }
}

Tensor shard_of(const Tensor& full, const ShardSpec& spec, int rank, int size) {
  if (spec.dim < 0 || size == 1) return full;
  const Shape local = shard_shape(full.shape(), spec, size);
  Tensor out = Tensor::empty(local, full.dtype(), full.device());
  const int64_t block = full.size(spec.dim) / spec.blocks, piece = block / size;
  for (int64_t b = 0; b < spec.blocks; ++b) {
    Tensor dst = out.narrow(spec.dim, b * piece, piece);
    dst.copy_(full.narrow(spec.dim, b * block + rank * piece, piece));
  }
  return out;
}

std::map<std::string, ShardSpec> collect_shard_specs(Module& root) {
  std::map<std::string, ShardSpec> out;
  for (auto& [path, m] : root.named_modules()) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(m);
    if (!sharded) continue;
    for (auto& [name, spec] : sharded->shard_specs())
      out.emplace(path.empty() ? name : path + "." + name, spec);
  }
  return out;
}

void normal_shard_(const Variable& p, uint64_t seed, float mean, float stddev, const Shape& full,
                   const ShardSpec& spec, int rank, int size) {
  std::vector<float> host(static_cast<size_t>(full.numel()));
  rng_normal(host.data(), host.size(), init::key_for(seed, p.name()), mean, stddev);
  const Tensor whole = Tensor::from_blob(host.data(), full, DType::F32);
  Tensor dst = p.data();
  dst.copy_(shard_of(whole, spec, rank, size));
}

}  // namespace strata::models::nn
