// The op API's embedding and cross-entropy (tensor/ops.h).
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  same_device(weight, ids, "embedding");
  require_int(ids, "embedding");
  STRATA_CHECK(weight.ndim() == 2, "embedding weight must be [V, C], got {}", weight.str());
  Tensor flat = ids.contiguous().reshape({ids.numel()});
  Shape s = ids.shape();
  s.push_back(weight.size(1));
  Tensor out = Tensor::empty(s, weight.dtype(), weight.device());
  Tensor out2 = out.view({ids.numel(), weight.size(1)});
  be(weight).embedding_forward(weight.contiguous(), flat, out2);
  return out;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  STRATA_CHECK(dweight.is_contiguous() && dweight.ndim() == 2, "embedding_backward: dweight {}",
               dweight.str());
  same_devices("embedding_backward", {&dweight, &ids, &dout});
  require_int(ids, "embedding_backward");
  compute_dtype("embedding_backward", {&dout, &dweight});
  Tensor flat = ids.contiguous().reshape({ids.numel()});
  Tensor d2 = dout.contiguous().reshape({ids.numel(), dweight.size(1)});
  be(dweight).embedding_backward(flat, d2, dweight);
}

namespace {
// What a cross-entropy backward reads per logit row: a target, an lse and a dloss, all on the
// logits' device (the kernels index them by row, so a shorter one would be read past its end).
void check_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                       const Tensor& dloss, const char* op) {
  same_devices(op, {&logits, &targets, &lse, &dloss});
  require_int(targets, op);
  require_f32(lse, op, "lse");
  require_f32(dloss, op, "dloss");
  const int64_t rows = rows_of(logits);
  STRATA_CHECK(
      logits.ndim() >= 1 && targets.numel() == rows && lse.numel() == rows && dloss.numel() == rows,
      "{}: logits {} need one target, lse and dloss per row, got targets {}, lse {}, "
      "dloss {}",
      op, logits.str(), targets.str(), lse.str(), dloss.str());
}

int64_t ce_classes(int64_t classes, int64_t v, const char* op) {
  if (classes < 0) return v;
  STRATA_CHECK(classes >= 1 && classes <= v, "{}: classes {} must be in [1, {}]", op, classes, v);
  return classes;
}
}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 int64_t classes) {
  same_device(logits, targets, "cross_entropy");
  require_int(targets, "cross_entropy");
  compute_dtype("cross_entropy", {&logits});  // losses and lse are F32 whatever it is
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy");
  Tensor l2 = logits.contiguous().reshape({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  STRATA_CHECK(l2.size(0) == t.size(0), "cross_entropy: {} logit rows but {} targets", l2.size(0),
               t.size(0));
  CrossEntropyResult r;
  r.losses = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.lse = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  be(logits).cross_entropy_forward(l2, t, ignore_index, classes, r.losses, r.lse);
  r.norm = Tensor::empty({2}, DType::F32, logits.device());
  be(logits).cross_entropy_norm(t, ignore_index, r.norm);
  return r;
}

CrossEntropyResult cross_entropy_fused_(Tensor& logits, const Tensor& targets, float grad,
                                        int64_t ignore_index, int64_t classes) {
  same_device(logits, targets, "cross_entropy_fused_");
  require_int(targets, "cross_entropy_fused_");
  compute_dtype("cross_entropy_fused_", {&logits});
  STRATA_CHECK(logits.is_contiguous(), "cross_entropy_fused_: logits {} are not contiguous",
               logits.str());
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_fused_");
  Tensor l2 = logits.view({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  STRATA_CHECK(l2.size(0) == t.size(0), "cross_entropy_fused_: {} logit rows but {} targets",
               l2.size(0), t.size(0));
  CrossEntropyResult r;
  r.losses = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.lse = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.norm = Tensor::empty({2}, DType::F32, logits.device());
  be(logits).cross_entropy_norm(t, ignore_index, r.norm);
  be(logits).cross_entropy_fused(l2, t, ignore_index, classes, grad, r.norm, r.losses, r.lse);
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index, int64_t classes) {
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_backward");
  const DType dt = compute_dtype("cross_entropy_backward", {&logits});
  check_ce_backward(logits, targets, lse, dloss, "cross_entropy_backward");
  Tensor l2 = logits.contiguous().reshape({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  Tensor dlogits = Tensor::empty(logits.shape(), dt, logits.device());
  Tensor d2 = dlogits.view({-1, v});
  be(logits).cross_entropy_backward(l2, t, lse.contiguous(), dloss.contiguous(), ignore_index,
                                    classes, d2);
  return dlogits;
}

void cross_entropy_backward_(Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& dloss, int64_t ignore_index, int64_t classes) {
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_backward_");
  compute_dtype("cross_entropy_backward_", {&logits});
  check_ce_backward(logits, targets, lse, dloss, "cross_entropy_backward_");
  STRATA_CHECK(logits.is_contiguous(), "cross_entropy_backward_: logits {} are not contiguous",
               logits.str());
  Tensor l2 = logits.view({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  // Backend::cross_entropy_backward allows dlogits to be logits (each element is read, then its
  // gradient written, by the same thread).
  be(logits).cross_entropy_backward(l2, t, lse.contiguous(), dloss.contiguous(), ignore_index,
                                    classes, l2);
}

}  // namespace strata::tensor
