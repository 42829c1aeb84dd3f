#pragma once
// cuBLASLt algorithm tuning (Note [cuBLASLt tuning] in matmul_tuning.cpp): the per-process table
// of each GEMM problem's algorithm, which run_gemm (matmul.cpp) consults, and the timing of a
// problem's candidates.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/cuda.h"
#include "tensor/tensor.h"

namespace strata::tensor::cuda {

// cuBLASLt's workspace for one GEMM (allocated once per backend, category workspace).
inline constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

// The problem an algorithm was chosen for. The heuristic sees the bias and aux pointers (it is
// given them before it runs) but has no preference for their alignment, so their own alignments
// are part of the key too: an algorithm picked for a 256-byte aligned bias is not reused for one
// that is only 16-byte aligned. The last field says whether an f32 problem runs on TF32 (Note
// [TF32]): its algorithms are another compute type's.
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int, int, bool, bool,
                       uint32_t, int, int64_t, uint32_t, uint32_t, bool>;

struct Tuning {
  std::mutex mu;
  bool configured = false;  // set by set_matmul_tuning or read from the environment
  bool on = false;
  std::string file;
  bool file_read = false;
  std::map<Key, std::pair<int, cublasLtMatmulAlgo_t>> recorded;  // from the file: rank, algo
  std::vector<CudaMatmulChoice> choices;
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algos;    // every problem's algorithm
  int paused = 0;                                              // live CudaMatmulTuningPause scopes
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> untuned;  // first met while paused
};

// The process's table (one per process: the backend is one device).
Tuning& tuning();

void configure_from_env(Tuning& t);

// The problem in words, for logs and cuda_matmul_choices().
std::string describe(const Key& key);

// What a tuning trial runs: the call's cublasLtMatmul with algorithm `algo`.
struct GemmCall {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const void *a, *b;
  void* out;
  size_t out_bytes;
  float alpha, beta;
  void* workspace;
  cudaStream_t stream;
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo) const {
    return cublasLtMatmul(lt, op, &alpha, b, la, a, lb, &beta, out, lc, out, lc, &algo, workspace,
                          static_cast<size_t>(kWorkspaceBytes), stream);
  }
};

// Times the heuristic's first kTuneCandidates algorithms and returns the one to keep (Note
// [cuBLASLt tuning]), or nothing when none runs.
std::optional<cublasLtMatmulAlgo_t> tune(Tuning& t, const Key& key, const GemmCall& call,
                                         cublasLtMatmulPreference_t pref, Device device);

}  // namespace strata::tensor::cuda
