// The CUDA backend's elementwise ops and rotary embedding (kernels in elementwise.cu).
#include "tensor/cuda/cuda_backend.h"

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  OpScope prof(stream_, "binary", 0, bytes_of({&a, &b, &out}));
  if (out.numel() == 0) return;
  launched(launch_binary(static_cast<int>(op), compute_dt("binary", out, a, b), a.data_ptr(),
                         broadcast_view(a, out.shape()), b.data_ptr(),
                         broadcast_view(b, out.shape()), out.data_ptr(), out.numel(), stream_),
           "binary");
}

void CudaBackend::affine(const Tensor& x, float alpha, float beta, Tensor& out) {
  OpScope prof(stream_, "affine", 0, bytes_of({&x, &out}));
  if (out.numel() == 0) return;
  launched(launch_affine(compute_dt("affine", out, x), x.data_ptr(), view_of(x), alpha, beta,
                         out.data_ptr(), out.numel(), stream_),
           "affine");
}

void CudaBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  OpScope prof(stream_, "axpy", 0, bytes_of({&x, &y, &y}));
  if (y.numel() == 0) return;
  // x and y may differ in dtype (gradient accumulation into an f32 buffer, or the reverse).
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(), "axpy {} into {}",
               x.str(), y.str());
  launched(launch_axpy(alpha, x.data_ptr(), compute_dt("axpy", x), y.data_ptr(),
                       compute_dt("axpy", y), y.numel(), stream_),
           "axpy");
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& out) {
  OpScope prof(stream_, "unary", 0, bytes_of({&x, &out}));
  if (out.numel() == 0) return;
  launched(launch_unary(static_cast<int>(op), compute_dt("unary", out, x), x.data_ptr(),
                        out.data_ptr(), out.numel(), stream_),
           "unary");
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) {
  OpScope prof(stream_, "unary_backward", 0, bytes_of({&x, &dy, &dx}));
  if (dx.numel() == 0) return;
  launched(launch_unary_backward(static_cast<int>(op), compute_dt("unary_backward", dx, x, dy),
                                 x.data_ptr(), dy.data_ptr(), dx.data_ptr(), dx.numel(), stream_),
           "unary_backward");
}

void CudaBackend::bias_add(const Tensor& x, const Tensor& bias, Tensor& out) {
  OpScope prof(stream_, "bias_add", 0, bytes_of({&x, &bias, &out}));
  if (out.numel() == 0) return;
  const int64_t c = bias.size(0);
  launched(launch_bias_add(compute_dt("bias_add", out, x, bias), x.data_ptr(), bias.data_ptr(),
                           out.data_ptr(), out.numel() / c, c, stream_),
           "bias_add");
}

void CudaBackend::dropout(const Tensor& x, float p, RngKey key, Tensor& out) {
  OpScope prof(stream_, "dropout", 0, bytes_of({&x, &out}));
  if (p == 0.f) return copy_on_device(x, out);
  if (out.numel() == 0) return;
  launched(launch_dropout(compute_dt("dropout", out, x), x.data_ptr(), out.data_ptr(), out.numel(),
                          p, key.seed, key.stream, stream_),
           "dropout");
}

void CudaBackend::rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
                         Tensor& out) {
  OpScope prof(stream_, "rotary", 0, bytes_of({&x, &cos, &sin, &out}));
  if (out.numel() == 0) return;
  // The tables are F32 (rotary_tables) or the compute dtype (Note [Low-precision ops]).
  const int t = compute_dt("rotary", out, x);
  STRATA_CHECK(cos.dtype() == sin.dtype() && (cos.dtype() == DType::F32 || dt(cos.dtype()) == t),
               "CUDA rotary: tables {} / {} for {}", cos.str(), sin.str(), x.str());
  launched(launch_rotary(t, x.data_ptr(), cos.data_ptr(), sin.data_ptr(), dt(cos.dtype()), inverse,
                         out.data_ptr(), x.size(0), x.size(1), x.size(2), x.size(3), stream_),
           "rotary");
}

}  // namespace strata::tensor::cuda
