#pragma once
// The cuBLASLt GEMM that matmul.cpp and linear.cpp share: out = alpha * op(a) @ op(b) + beta * out
// with an optional epilogue, in the row-major/column-major mapping of Note [CUDA matmul]
// (matmul.cpp), its algorithm chosen once per problem (Note [cuBLASLt tuning]).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/tensor.h"

namespace strata::tensor::cuda {

// An epilogue for one GEMM (Note [CUDA linear epilogues]).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS_POINTER: the bias read, or the bias gradient written
  const void* aux = nullptr;   // EPILOGUE_AUX_POINTER: the GELU input, written or read
  int64_t aux_ld = 0;
};

// cuBLASLt's name of an epilogue kind, for logs and the tuning file.
const char* epilogue_name(cublasLtEpilogue_t e);

// out = alpha * op(a) @ op(b) + beta * out with epilogue `epi` on `stream` (Note [CUDA matmul]).
// Shapes and dtypes are the caller's to check; k > 0. Returns false, having enqueued nothing, when
// cuBLASLt has no algorithm for the problem or refuses it.
bool run_gemm(cublasLtHandle_t lt, Tensor& workspace, cudaStream_t stream, const Tensor& a,
              const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha, float beta,
              const Epilogue& epi);

}  // namespace strata::tensor::cuda
