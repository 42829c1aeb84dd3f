#include "tensor/backend.h"

#include "tensor/cpu/cpu_backend.h"

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
  if (g_cuda_backend == nullptr)
    user_error(
        "device {} was asked for, but this build of Strata has no CUDA backend or no GPU "
        "was found; use device: cpu",
        device.str());
  return *g_cuda_backend;
}

}  // namespace strata::tensor
