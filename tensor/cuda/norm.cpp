// The CUDA backend's norms (plain and fused with the residual add) and softmax (kernels in
// norm.cu and softmax.cu).
#include "tensor/cuda/cuda_backend.h"

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  OpScope prof(stream_, "layernorm_forward", 0, bytes_of({&x, &weight, &bias, &y}));
  launched(launch_layernorm_forward(compute_dt("layernorm", x, weight, bias, y), x.data_ptr(),
                                    weight.data_ptr(), bias.data_ptr(), eps, y.data_ptr(),
                                    mean.data<float>(), rstd.data<float>(), x.size(0), x.size(1),
                                    stream_),
           "layernorm_forward");
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias, bool accumulate) {
  OpScope prof(stream_, "layernorm_backward", 0,
               bytes_of({&dy, &x, &weight, &dx, &dweight, &dbias}));
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(2 * chunks * c * 4);
  launched(launch_norm_backward(
               compute_dt("layernorm_backward", x, dy, weight, dx, dweight, dbias), dy.data_ptr(),
               nullptr, x.data_ptr(), weight.data_ptr(), mean.data<float>(), rstd.data<float>(),
               dx.data_ptr(), dweight.data_ptr(), dbias.data_ptr(),
               static_cast<float*>(s.data_ptr()), n, c, fused_norm_grads(), accumulate, stream_),
           "layernorm_backward");
}

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                                  Tensor& rstd) {
  OpScope prof(stream_, "rmsnorm_forward", 0, bytes_of({&x, &weight, &y}));
  launched(
      launch_rmsnorm_forward(compute_dt("rmsnorm", x, weight, y), x.data_ptr(), weight.data_ptr(),
                             eps, y.data_ptr(), rstd.data<float>(), x.size(0), x.size(1), stream_),
      "rmsnorm_forward");
}

void CudaBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                   bool accumulate) {
  OpScope prof(stream_, "rmsnorm_backward", 0, bytes_of({&dy, &x, &weight, &dx, &dweight}));
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(chunks * c * 4);
  launched(launch_norm_backward(compute_dt("rmsnorm_backward", x, dy, weight, dx, dweight),
                                dy.data_ptr(), nullptr, x.data_ptr(), weight.data_ptr(), nullptr,
                                rstd.data<float>(), dx.data_ptr(), dweight.data_ptr(), nullptr,
                                static_cast<float*>(s.data_ptr()), n, c, fused_norm_grads(),
                                accumulate, stream_),
           "rmsnorm_backward");
}

// Note [CUDA fused residual norm] (norm.cu).
void CudaBackend::add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                        const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                        Tensor& mean, Tensor& rstd) {
  OpScope prof(stream_, "add_layernorm_forward", 0, bytes_of({&x, &r, &weight, &bias, &s, &y}));
  launched(launch_add_layernorm_forward(
               compute_dt("add_layernorm", x, r, weight, bias, s, y), x.data_ptr(), r.data_ptr(),
               weight.data_ptr(), bias.data_ptr(), eps, s.data_ptr(), y.data_ptr(),
               mean.data<float>(), rstd.data<float>(), x.size(0), x.size(1), stream_),
           "add_layernorm_forward");
}

void CudaBackend::add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                         const Tensor& weight, const Tensor& mean,
                                         const Tensor& rstd, Tensor& dsum, Tensor& dweight,
                                         Tensor& dbias, bool accumulate) {
  OpScope prof(stream_, "add_layernorm_backward", 0,
               bytes_of({&dy, &ds, &s, &weight, &dsum, &dweight, &dbias}));
  const int64_t n = s.size(0), c = s.size(1);
  const int t = compute_dt("add_layernorm_backward", s, dy, weight, dsum, dweight, dbias);
  if (ds.defined()) compute_dt("add_layernorm_backward", s, ds);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor sc = scratch(2 * chunks * c * 4);
  launched(launch_norm_backward(t, dy.data_ptr(), ds.defined() ? ds.data_ptr() : nullptr,
                                s.data_ptr(), weight.data_ptr(), mean.data<float>(),
                                rstd.data<float>(), dsum.data_ptr(), dweight.data_ptr(),
                                dbias.data_ptr(), static_cast<float*>(sc.data_ptr()), n, c,
                                fused_norm_grads(), accumulate, stream_),
           "add_layernorm_backward");
}

void CudaBackend::add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                      float eps, Tensor& s, Tensor& y, Tensor& rstd) {
  OpScope prof(stream_, "add_rmsnorm_forward", 0, bytes_of({&x, &r, &weight, &s, &y}));
  launched(
      launch_add_rmsnorm_forward(compute_dt("add_rmsnorm", x, r, weight, s, y), x.data_ptr(),
                                 r.data_ptr(), weight.data_ptr(), eps, s.data_ptr(), y.data_ptr(),
                                 rstd.data<float>(), x.size(0), x.size(1), stream_),
      "add_rmsnorm_forward");
}

void CudaBackend::add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                       const Tensor& weight, const Tensor& rstd, Tensor& dsum,
                                       Tensor& dweight, bool accumulate) {
  OpScope prof(stream_, "add_rmsnorm_backward", 0,
               bytes_of({&dy, &ds, &s, &weight, &dsum, &dweight}));
  const int64_t n = s.size(0), c = s.size(1);
  const int t = compute_dt("add_rmsnorm_backward", s, dy, weight, dsum, dweight);
  if (ds.defined()) compute_dt("add_rmsnorm_backward", s, ds);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor sc = scratch(chunks * c * 4);
  launched(
      launch_norm_backward(t, dy.data_ptr(), ds.defined() ? ds.data_ptr() : nullptr, s.data_ptr(),
                           weight.data_ptr(), nullptr, rstd.data<float>(), dsum.data_ptr(),
                           dweight.data_ptr(), nullptr, static_cast<float*>(sc.data_ptr()), n, c,
                           fused_norm_grads(), accumulate, stream_),
      "add_rmsnorm_backward");
}

void CudaBackend::softmax_forward(const Tensor& x, Tensor& y) {
  OpScope prof(stream_, "softmax_forward", 0, bytes_of({&x, &y}));
  launched(launch_softmax_forward(compute_dt("softmax", x, y), x.data_ptr(), y.data_ptr(),
                                  x.size(0), x.size(1), stream_),
           "softmax_forward");
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  OpScope prof(stream_, "softmax_backward", 0, bytes_of({&y, &dy, &dx}));
  launched(launch_softmax_backward(compute_dt("softmax_backward", y, dy, dx), y.data_ptr(),
                                   dy.data_ptr(), dx.data_ptr(), y.size(0), y.size(1), stream_),
           "softmax_backward");
}

}  // namespace strata::tensor::cuda
