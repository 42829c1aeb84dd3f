#pragma once
// Device helpers shared by Strata's own attention kernels: the SIMT kernel (attention.cu) and the
// tensor-core kernel (attention_tc.cu).
#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

__device__ inline float attn_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float attn_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Offset of row t of head (b, h) of an operand with strides st (Note [Strided attention operands]
// in tensor/backend.h).
__device__ inline int64_t row_at(const AttentionStrides& st, int64_t b, int64_t h, int64_t t) {
  return b * st.b + h * st.h + t * st.t;
}

// Last key query i may see (-1: none). The causal mask is aligned bottom-right: query i sees key
// j when j <= i + (tk - tq).
__device__ inline int64_t last_key(bool causal, int64_t i, int64_t tq, int64_t tk) {
  if (!causal) return tk - 1;
  const int64_t j = i + (tk - tq);
  return j < tk - 1 ? j : tk - 1;
}

}  // namespace strata::tensor::cuda
