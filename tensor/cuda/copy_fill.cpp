// The CUDA backend's fill, arange, random draws and concat (kernels in copy_fill.cu).
#include "tensor/cuda/cuda_backend.h"

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

void CudaBackend::fill(Tensor& dst, double value) {
  OpScope prof(stream_, "fill", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  if (value == 0.0 && dst.is_contiguous()) {
    check_cuda(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream_), "cudaMemsetAsync");
    return;
  }
  launch_fill(dst.data_ptr(), dt(dst.dtype()), view_of(dst), dst.numel(), value, stream_);
  check_launch("fill");
}

void CudaBackend::arange(Tensor& dst, double start, double step) {
  OpScope prof(stream_, "arange", 0, bytes_of({&dst}));
  STRATA_CHECK(dst.is_contiguous(), "arange into non-contiguous {}", dst.str());
  if (dst.numel() == 0) return;
  launch_arange(dst.data_ptr(), dt(dst.dtype()), dst.numel(), start, step, stream_);
  check_launch("arange");
}

void CudaBackend::random_uniform(Tensor& dst, RngKey key, float lo, float hi) {
  OpScope prof(stream_, "random_uniform", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  // Float dtypes draw in place (rounded once per value); other layouts/dtypes via an F32 draw.
  Tensor f = is_float(dst.dtype()) && dst.is_contiguous()
                 ? dst
                 : Tensor::empty(dst.shape(), DType::F32, device());
  launched(launch_random_uniform(f.data_ptr(), dt(f.dtype()), f.numel(), key.seed, key.stream, lo,
                                 hi, stream_),
           "random_uniform");
  if (!f.is_same(dst)) copy_on_device(f, dst);
}

void CudaBackend::random_normal(Tensor& dst, RngKey key, float mean, float stddev) {
  OpScope prof(stream_, "random_normal", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  // Float dtypes draw in place (rounded once per value); other layouts/dtypes via an F32 draw.
  Tensor f = is_float(dst.dtype()) && dst.is_contiguous()
                 ? dst
                 : Tensor::empty(dst.shape(), DType::F32, device());
  launched(launch_random_normal(f.data_ptr(), dt(f.dtype()), f.numel(), key.seed, key.stream, mean,
                                stddev, stream_),
           "random_normal");
  if (!f.is_same(dst)) copy_on_device(f, dst);
}

void CudaBackend::concat(const std::vector<Tensor>& xs, int dim, Tensor& out) {
  OpScope prof(stream_, "concat", 0, 2 * bytes_of({&out}));
  dim = out.shape().normalize(dim);
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.size(dim);
    if (len > 0 && x.numel() > 0) {
      Tensor part = out.narrow(dim, start, len);
      copy_on_device(x, part);
    }
    start += len;
  }
  STRATA_CHECK(start == out.size(dim), "concat: pieces add up to {} along dim {}, out has {}",
               start, dim, out.size(dim));
}

}  // namespace strata::tensor::cuda
