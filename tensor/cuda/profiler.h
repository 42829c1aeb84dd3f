#pragma once
// Timing of the device work each CUDA backend op enqueues (Note [CUDA op profiler] in
// profiler.cpp). Internal to tensor/cuda; code outside uses tensor::CudaProfileScope
// (tensor/cuda.h).
#include <initializer_list>
#include <string>

#include "tensor/tensor.h"

struct CUstream_st;

namespace strata::tensor::cuda {

// While profiling is on (tensor::cuda_profile_start), times the device work enqueued on `stream`
// between construction and destruction under the name `op`, with `flops` and `bytes` (what the op
// computes and moves) added to its totals. Off, it reads one flag. Scopes nest: an op that calls
// another (linear's fallback calling matmul) is timed once, as the outer op.
class OpScope {
 public:
  OpScope(CUstream_st* stream, const char* op, double flops = 0.0, double bytes = 0.0);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  // Reports the op as "op[detail]" (attention: the path that ran).
  void detail(const char* d);

 private:
  CUstream_st* stream_ = nullptr;
  int slot_ = -1;        // this scope's entry while it records; -1 when it does not
  bool nested_ = false;  // inside another recording scope
};

// The bytes of the defined tensors among `ts` (what an op reads and writes, for GB/s).
double bytes_of(std::initializer_list<const Tensor*> ts);

}  // namespace strata::tensor::cuda
