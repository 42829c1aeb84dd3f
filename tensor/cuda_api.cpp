#include "tensor/cuda.h"

#include "core/error.h"

#ifdef STRATA_HAVE_CUDA
namespace strata::tensor::cuda {
int device_count();
void init(int device);
void* current_stream();
CudaDeviceFacts device_facts(int device);
void set_matmul_tuning(bool on, const std::string& file);
std::vector<CudaMatmulChoice> matmul_choices();
void pause_matmul_tuning(int delta);
void set_tf32(bool on);
bool tf32();
}  // namespace strata::tensor::cuda
#endif

namespace strata::tensor {

bool cuda_built() {
#ifdef STRATA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef STRATA_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

void init_cuda(int device) {
#ifdef STRATA_HAVE_CUDA
  cuda::init(device);
#else
  user_error(
      "device: cuda requested but this build of Strata has no CUDA backend (it was configured "
      "without a CUDA toolkit or with -DSTRATA_WITH_CUDA=OFF); rebuild with nvcc on PATH, or use "
      "device: cpu (device {} was asked for)",
      device);
#endif
}

void* cuda_current_stream() {
#ifdef STRATA_HAVE_CUDA
  return cuda::current_stream();
#else
  init_cuda(0);  // raises: this build has no CUDA backend
  return nullptr;
#endif
}

CudaDeviceFacts cuda_device_facts(int device) {
#ifdef STRATA_HAVE_CUDA
  return cuda::device_facts(device);
#else
  init_cuda(device);  // raises: this build has no CUDA backend
  return {};
#endif
}

void set_cuda_matmul_tuning(bool on, const std::string& file) {
#ifdef STRATA_HAVE_CUDA
  cuda::set_matmul_tuning(on, file);
#else
  if (on) init_cuda(0);  // raises: this build has no CUDA backend
  (void)file;
#endif
}

void set_cuda_tf32(bool on) {
#ifdef STRATA_HAVE_CUDA
  cuda::set_tf32(on);
#else
  if (on) init_cuda(0);  // raises: this build has no CUDA backend
#endif
}

bool cuda_tf32() {
#ifdef STRATA_HAVE_CUDA
  return cuda::tf32();
#else
  return false;
#endif
}

std::vector<CudaMatmulChoice> cuda_matmul_choices() {
#ifdef STRATA_HAVE_CUDA
  return cuda::matmul_choices();
#else
  return {};
#endif
}

CudaMatmulTuningPause::CudaMatmulTuningPause() {
#ifdef STRATA_HAVE_CUDA
  cuda::pause_matmul_tuning(1);
#endif
}

CudaMatmulTuningPause::~CudaMatmulTuningPause() {
#ifdef STRATA_HAVE_CUDA
  cuda::pause_matmul_tuning(-1);
#endif
}

#ifndef STRATA_HAVE_CUDA
// Without the CUDA backend there is nothing to time (tensor/cuda/profiler.cpp in CUDA builds).
void cuda_profile_start() {}

std::vector<CudaOpTime> cuda_profile_stop() {
  return {};
}

CudaProfileScope::CudaProfileScope(const char*, double, double) {}

CudaProfileScope::~CudaProfileScope() = default;
#endif

}  // namespace strata::tensor
