// Note [Vocab-parallel cross-entropy] and the vocab-parallel embedding's masked lookup: forward
// and backward side by side.
#include <algorithm>
#include <limits>
#include <vector>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

Variable masked_embedding(const Variable& weight, const Tensor& ids, const Tensor& mask) {
  const Shape ws = weight.shape();
  const DType wt = weight.dtype();
  const Device dev = weight.device();
  Tensor y = tops::mul(tops::embedding(weight.data(), ids), mask);
  return make_output("MaskedEmbedding", y, {weight}, [=](const std::vector<Tensor>& g) {
    Tensor dw = tops::zeros(ws, wt, dev);
    tops::embedding_backward(ids, tops::mul(g[0], mask), dw);
    return std::vector<Tensor>{dw};
  });
}

Variable vocab_parallel_cross_entropy(const Variable& logits, const Tensor& targets,
                                      int64_t vocab_start, int64_t classes, const TpGroup& group,
                                      int64_t ignore_index) {
  if (tp_size(group) == 1) return cross_entropy(logits, targets, ignore_index, classes);
  const Tensor& ld = logits.data();
  const int64_t vl = ld.size(-1);
  // A view for a linear's f32 output; low-precision logits are computed on in f32.
  const Tensor L =
      ld.dtype() == DType::F32 ? ld.reshape({-1, vl}) : ld.reshape({-1, vl}).to(DType::F32);
  const int64_t n = L.size(0);
  STRATA_CHECK(targets.numel() == n, "vocab_parallel_cross_entropy: targets {} for logits {}",
               targets.str(), ld.str());
  const Device dev = ld.device();
  // Columns of this slice that are real tokens: [0, local_classes).
  const int64_t local_classes = std::clamp<int64_t>(classes - vocab_start, 0, vl);

  // Targets are few ([rows] ints): their masks are made on the host.
  const std::vector<int64_t> t = tops::to_int_vector(targets);
  std::vector<int64_t> index(static_cast<size_t>(n), 0);
  std::vector<float> here(static_cast<size_t>(n), 0.f), counted(static_cast<size_t>(n), 0.f);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ti = t[static_cast<size_t>(i)];
    if (ti == ignore_index) continue;
    STRATA_USER_CHECK(ti >= 0 && ti < classes, "target {} outside the vocabulary of {}", ti,
                      classes);
    ++count;
    counted[static_cast<size_t>(i)] = 1.f;
    if (ti >= vocab_start && ti < vocab_start + local_classes) {
      index[static_cast<size_t>(i)] = i * vl + (ti - vocab_start);
      here[static_cast<size_t>(i)] = 1.f;
    }
  }
  const float inv_m = 1.f / static_cast<float>(std::max<int64_t>(1, count));
  auto on_dev = [&](Tensor h) { return dev.is_cpu() ? h : h.to(dev); };
  const Tensor index_t = on_dev(tops::from_ints(index, {n}));
  const Tensor here_t = on_dev(tops::from_vector(here, {n}));
  const Tensor counted_t = on_dev(tops::from_vector(counted, {n}));
  auto allreduce = [&](Tensor x, comm::ReduceOp op) {
    group->allreduce(x, op)->wait();
    return x;
  };

  // The row maximum over the real tokens of every slice.
  Tensor mx = local_classes > 0
                  ? tops::max(local_classes == vl ? L : L.narrow(1, 0, local_classes), 1)
                        .values.contiguous()
                  : tops::full({n}, -std::numeric_limits<double>::infinity(), L.dtype(), dev);
  mx = allreduce(mx, comm::ReduceOp::Max);
  const Tensor mx_col = mx.view({n, 1});
  Tensor e = tops::unary(tensor::UnaryOp::Exp, tops::sub(L, mx_col));
  if (local_classes < vl) {
    Tensor pad = e.narrow(1, local_classes, vl - local_classes);
    pad.zero_();
  }
  const Tensor s = allreduce(tops::sum(e, 1).contiguous(), comm::ReduceOp::Sum);
  // The target's logit: a row gather through the embedding op on [rows * Vl, 1].
  Tensor z =
      tops::mul(tops::embedding(L.contiguous().view({n * vl, 1}), index_t).view({n}), here_t);
  z = allreduce(z.contiguous(), comm::ReduceOp::Sum);
  const Tensor losses =
      tops::mul(tops::sub(tops::add(tops::unary(tensor::UnaryOp::Log, s), mx), z), counted_t);
  Tensor loss = tops::scale(tops::sum_all(losses), inv_m);

  const Shape shape = ld.shape();
  const DType dtype = ld.dtype();
  return make_output("VocabParallelCrossEntropy", loss, {logits},
                     [=](const std::vector<Tensor>& g) {
                       // Per row: g / m where counted, 0 elsewhere.
                       const Tensor coef = tops::scale(tops::mul(counted_t, g[0]), inv_m);
                       Tensor d = tops::mul(tops::div(e, s.view({n, 1})), coef.view({n, 1}));
                       // - onehot * coef, scattered into the target column of the rows this slice
                       // holds.
                       Tensor flat = d.view({n * vl, 1});
                       tops::embedding_backward(
                           index_t, tops::scale(tops::mul(coef, here_t), -1.f).view({n, 1}), flat);
                       return std::vector<Tensor>{d.view(shape).to(dtype)};
                     });
}

}  // namespace strata::autograd
