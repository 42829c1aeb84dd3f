#include "tensor/backend.h"

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cuda.h"

namespace strata::tensor {

namespace {
Backend* g_cuda_backend = nullptr;
}

void register_backend(DeviceType type, Backend* backend) {
  STRATA_CHECK(type == DeviceType::CUDA, "only the CUDA backend is registered at run time");
  g_cuda_backend = backend;
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu::CpuBackend::instance();
  // Note [CUDA backend registration]: the first use turns the backend on (or says why not).
  if (g_cuda_backend == nullptr) init_cuda(device.index);
  STRATA_CHECK(g_cuda_backend != nullptr, "init_cuda did not register a backend");
  return *g_cuda_backend;
}

}  // namespace strata::tensor
