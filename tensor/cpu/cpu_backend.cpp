#include "tensor/cpu/cpu_backend.h"

namespace strata::tensor::cpu {

CpuBackend& CpuBackend::instance() {
  static CpuBackend b;
  return b;
}

}  // namespace strata::tensor::cpu
