#pragma once
// Which library computes CPU matmuls (tensor/cpu/matmul.cpp): oneDNN when Strata is built with
// it, Eigen otherwise. Tests switch engines to check that both agree; STRATA_MATMUL=eigen (or
// =onednn) in the environment sets the starting choice.
#include <cstdint>

namespace strata::tensor::cpu {

enum class MatmulEngine : uint8_t { OneDnn, Eigen };

// True when this build can use oneDNN.
bool have_onednn();
// The engine CpuBackend::matmul uses now.
MatmulEngine matmul_engine();
// Process-wide. Asking for OneDnn in a build without it is a UserError.
void set_matmul_engine(MatmulEngine engine);

// Sets the engine for a scope, restoring the previous one after.
class MatmulEngineScope {
 public:
  explicit MatmulEngineScope(MatmulEngine engine) : prev_(matmul_engine()) {
    set_matmul_engine(engine);
  }
  ~MatmulEngineScope() { set_matmul_engine(prev_); }
  MatmulEngineScope(const MatmulEngineScope&) = delete;
  MatmulEngineScope& operator=(const MatmulEngineScope&) = delete;

 private:
  MatmulEngine prev_;
};

}  // namespace strata::tensor::cpu
