#include "tensor/cpu/cpu_backend.h"

namespace strata::tensor::cpu {}  // namespace strata::tensor::cpu
