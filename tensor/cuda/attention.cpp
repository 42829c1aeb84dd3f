// The CUDA backend's attention: cuDNN first, else Strata's own kernels (attention.cu,
// attention_tc.cu, attention_decode.cu; Note [cuDNN SDPA] in cudnn_sdpa.cpp).
#include "tensor/cuda/cuda_backend.h"

#include <algorithm>

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

namespace {
// The kernel's view of the operands (Note [Strided attention operands] in tensor/backend.h).
AttentionStrides strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}
AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out) {
  AttentionShape s;
  s.b = q.size(0), s.h = q.size(1), s.tq = q.size(2), s.tk = k.size(2), s.d = q.size(3);
  s.q = strides_of(q), s.k = strides_of(k), s.v = strides_of(v), s.out = strides_of(out);
  return s;
}
}  // namespace

namespace {
// FLOPs of the attention matmuls (Note [CUDA op profiler]): 2 per multiply-add over the (query,
// key) pairs a row sees (bottom-right causal: Tq * Tk - Tq * (Tq - 1) / 2), two matmuls of depth D
// forward, five backward (the recomputed scores, dV, dP, dK, dQ).
double attention_flops(const Tensor& q, const Tensor& k, bool causal, bool backward) {
  const double tq = static_cast<double>(q.size(2)), tk = static_cast<double>(k.size(2));
  double pairs = tq * tk;
  if (causal) pairs = std::max(0.0, tq <= tk ? tq * tk - tq * (tq - 1) / 2 : tk * (tk + 1) / 2);
  const double per_pair_matmul = 2.0 * static_cast<double>(q.size(3));
  return static_cast<double>(q.size(0) * q.size(1)) * pairs * per_pair_matmul *
         (backward ? 5.0 : 2.0);
}

// Names the profiled attention op after the path that ran, when the op's scope ends.
struct NamePath {
  OpScope& prof;
  ~NamePath() { prof.detail(attention_path_name(last_attention_path())); }
};
}  // namespace

void CudaBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    float scale, Tensor& out, Tensor& lse) {
  OpScope prof(stream_, "attention_forward", attention_flops(q, k, causal, false),
               bytes_of({&q, &k, &v, &out, &lse}));
  const NamePath name_path{prof};
  // cuDNN flash attention first (bf16/f16), else the own kernel (Note [cuDNN SDPA]).
  if (try_cudnn_attention_forward(stream_, q, k, v, causal, scale, out, lse)) return;
  const int64_t d = q.size(3);
  if (d > kAttentionMaxHeadDim)
    user_error(
        "attention head_dim {} is larger than the CUDA kernel's limit {}; use a smaller "
        "head size (n_embd / n_head)",
        d, kAttentionMaxHeadDim);
  const int dt = compute_dt("attention", q, k, v, out);
  const AttentionShape shape = attention_shape(q, k, v, out);
  // Note [CUDA decode attention]: a decode step's keys split over the whole device.
  if (attention_mode() != AttentionMode::Simt && attention_decode_fits(shape.tq, shape.tk, d) &&
      split_decode_attention()) {
    set_last_attention_path(AttentionPath::OwnDecode);
    const int64_t rows = shape.b * shape.h * shape.tq;
    const DecodeSplits sp = attention_decode_splits(rows, shape.tk, multiprocessors());
    Tensor part = scratch(rows * sp.splits * (d + 2) * 4);
    launched(launch_attention_decode_forward(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), causal,
                                             scale, out.data_ptr(), lse.data<float>(), shape, sp,
                                             static_cast<float*>(part.data_ptr()), stream_),
             "attention_forward");
    return;
  }
  // Note [CUDA tensor-core attention]: the own kernel on the tensor cores where it is built for.
  const bool tc =
      attention_mode() != AttentionMode::Simt && attention_tc_fits(dt, d, q.size(0), q.size(1));
  if (tc) set_last_attention_path(AttentionPath::OwnTensorCore);
  const auto launch = tc ? &launch_attention_tc_forward : &launch_attention_forward;
  launched(launch(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), causal, scale, out.data_ptr(),
                  lse.data<float>(), shape, stream_),
           "attention_forward");
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     bool causal, float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  OpScope prof(stream_, "attention_backward", attention_flops(q, k, causal, true),
               bytes_of({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}));
  const NamePath name_path{prof};
  if (try_cudnn_attention_backward(stream_, q, k, v, out, lse, dout, causal, scale, dq, dk, dv))
    return;
  const int64_t bh = q.size(0) * q.size(1), tq = q.size(2), d = q.size(3);
  if (d > kAttentionMaxHeadDim)
    user_error("attention head_dim {} is larger than the CUDA kernel's limit {}", d,
               kAttentionMaxHeadDim);
  AttentionShape shape = attention_shape(q, k, v, out);
  shape.dout = strides_of(dout), shape.dq = strides_of(dq), shape.dk = strides_of(dk),
  shape.dv = strides_of(dv);
  Tensor s = scratch(bh * tq * 4);
  const int dt = compute_dt("attention_backward", q, k, v, out, dout, dq, dk, dv);
  const bool tc =
      attention_mode() != AttentionMode::Simt && attention_tc_fits(dt, d, q.size(0), q.size(1));
  if (tc) set_last_attention_path(AttentionPath::OwnTensorCore);
  const auto launch = tc ? &launch_attention_tc_backward : &launch_attention_backward;
  launched(launch(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data<float>(),
                  dout.data_ptr(), causal, scale, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                  static_cast<float*>(s.data_ptr()), shape, stream_),
           "attention_backward");
}

}  // namespace strata::tensor::cuda
