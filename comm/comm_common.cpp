#include "comm/comm_common.h"

#include <fmt/format.h>

#include "core/error.h"

namespace strata::comm::detail {

std::string describe(const Communicator& comm) {
  return fmt::format("communicator '{}' ({}, rank {} of {})", comm.name(), comm.backend(),
                     comm.rank(), comm.size());
}

std::string describe_op(std::string_view op, const tensor::Tensor& t) {
  return fmt::format("{} of {} {}", op, t.numel(), dtype_name(t.dtype()));
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::string format_duration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return fmt::format("{} s", d.count() / 1000);
  return fmt::format("{} ms", d.count());
}

void check_tensor(const Communicator& comm, std::string_view op, std::string_view role,
                  const tensor::Tensor& t, bool allow_cuda) {
  STRATA_USER_CHECK(t.defined(), "{}: {} got an undefined {}", describe(comm), op, role);
  STRATA_USER_CHECK(t.is_contiguous(), "{}: {} needs a contiguous {}, got {}", describe(comm), op,
                    role, t.str());
  STRATA_USER_CHECK(t.device().is_cpu() || (allow_cuda && t.device().is_cuda()),
                    "{}: {} got {} {} on {}; the {} backend serves {}", describe(comm), op,
                    role.starts_with("i") ? "an" : "a", role, t.device().str(), comm.backend(),
                    allow_cuda ? "cpu and cuda" : "cpu only");
}

void check_reducible(const Communicator& comm, std::string_view op, const tensor::Tensor& t,
                     bool allow_half) {
  const DType d = t.dtype();
  const bool ok = d == DType::F32 || d == DType::I32 || d == DType::I64 ||
                  (allow_half && (d == DType::BF16 || d == DType::F16));
  STRATA_USER_CHECK(ok, "{}: {} cannot reduce {} tensors; the {} backend reduces f32, i32, i64{}",
                    describe(comm), op, dtype_name(d), comm.backend(),
                    allow_half ? ", bf16 and f16" : " (bf16/f16 need the nccl backend)");
}

void check_scatter_shapes(const Communicator& comm, std::string_view op,
                          const tensor::Tensor& whole, const tensor::Tensor& chunk) {
  STRATA_USER_CHECK(whole.dtype() == chunk.dtype(), "{}: {} mixes dtypes: {} and {}",
                    describe(comm), op, whole.str(), chunk.str());
  STRATA_USER_CHECK(whole.device() == chunk.device(), "{}: {} mixes devices: {} and {}",
                    describe(comm), op, whole.str(), chunk.str());
  STRATA_USER_CHECK(whole.numel() == chunk.numel() * comm.size(),
                    "{}: {} needs the whole tensor to hold size() = {} chunks: chunk {} has {} "
                    "elements, whole {} has {} (expected {})",
                    describe(comm), op, comm.size(), chunk.str(), chunk.numel(), whole.str(),
                    whole.numel(), chunk.numel() * comm.size());
}

void check_peer(const Communicator& comm, std::string_view op, int peer, int tag) {
  STRATA_USER_CHECK(peer >= 0 && peer < comm.size(),
                    "{}: {} to/from rank {}, which is not in [0, {})", describe(comm), op, peer,
                    comm.size());
  STRATA_USER_CHECK(peer != comm.rank(),
                    "{}: {} with itself (peer {} is this rank); ops run one at a time, so a rank "
                    "cannot send to itself — copy the tensor instead",
                    describe(comm), op, peer);
  // 32767 is the smallest MPI_TAG_UB the MPI standard allows.
  STRATA_USER_CHECK(tag >= 0 && tag <= 32767, "{}: {} tag {} is not in [0, 32767]", describe(comm),
                    op, tag);
}

void check_root(const Communicator& comm, int root) {
  STRATA_USER_CHECK(root >= 0 && root < comm.size(), "{}: broadcast root {} is not in [0, {})",
                    describe(comm), root, comm.size());
}

bool is_chunk_of(const tensor::Tensor& chunk, const tensor::Tensor& whole, int64_t index) {
  return chunk.storage() == whole.storage() && chunk.dtype() == whole.dtype() &&
         chunk.is_contiguous() && whole.is_contiguous() &&
         chunk.offset() == whole.offset() + index * chunk.numel();
}

bool overlaps(const tensor::Tensor& a, const tensor::Tensor& b) {
  if (a.storage() != b.storage() || a.numel() == 0 || b.numel() == 0) return false;
  // Contiguous tensors (every caller checked): byte ranges from offset and size.
  const int64_t a0 = a.offset() * static_cast<int64_t>(a.element_size());
  const int64_t b0 = b.offset() * static_cast<int64_t>(b.element_size());
  return a0 < b0 + static_cast<int64_t>(b.nbytes()) && b0 < a0 + static_cast<int64_t>(a.nbytes());
}

}  // namespace strata::comm::detail
