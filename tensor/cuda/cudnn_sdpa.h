#pragma once
// cuDNN fused scaled-dot-product attention (flash attention) for the CUDA backend, and the choice
// between it and Strata's own kernel (tensor/cuda/attention.cu). See Note [cuDNN SDPA] in
// cudnn_sdpa.cpp for the graphs, the lse contract and determinism.
//
// Every function here exists in every CUDA build; without cuDNN headers at build time, or without
// a loadable libcudnn.so.9 at run time, the cuDNN functions return false and say why.
// This header includes no cuDNN header (the tests include it).
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

struct CUstream_st;

namespace strata::tensor::cuda {

// STRATA_ATTENTION=own|simt|cudnn|auto (unset or empty: auto). auto tries cuDNN and falls back to
// the own kernels; own never tries cuDNN; simt never tries cuDNN nor the own tensor-core kernel
// (Note [CUDA tensor-core attention]); cudnn makes any case cuDNN cannot run a UserError (tests
// and benchmarks use it to be sure which path they measure). Read on every call, so a test may
// change it; any other value is a UserError naming the variable.
enum class AttentionMode { Auto, Own, Cudnn, Simt };
AttentionMode attention_mode();

// The implementation the last attention_forward / attention_backward on this thread ran (None
// before the first). Tests check it to know that what they compared was cuDNN's result.
// Own is the SIMT kernel (attention.cu), OwnTensorCore the tensor-core one (attention_tc.cu),
// OwnDecode the split-key decode forward (attention_decode.cu).
enum class AttentionPath { None, Own, OwnTensorCore, OwnDecode, Cudnn };
AttentionPath last_attention_path();
void set_last_attention_path(AttentionPath path);
const char* attention_path_name(AttentionPath path);

// This binary was compiled against the cuDNN headers (the graph API).
bool cudnn_built();
// libcudnn.so.9 was loaded (dlopen, first call) and is a 9.x release. `why` gets the reason
// when not. Never throws.
bool cudnn_loaded(std::string* why = nullptr);

// The version number of the loaded libcudnn (major * 10000 + minor * 100 + patch, e.g. 91002 for
// 9.10.2); 0 when cuDNN is not built in or not loadable.
int64_t cudnn_loaded_version();
// The compute capability of CUDA device `device` as major * 10 + minor (90 for H100); 0 when it
// cannot be read. Cached per device.
int cuda_sm_version(int device);

// Note [cuDNN SDPA limits]: the known limits and bugs of cuDNN's fused attention that Strata's
// graphs would run into, by cuDNN version and GPU architecture. Empty when none applies, else
// the reason (the call then goes to the own kernel, or is a UserError under
// STRATA_ATTENTION=cudnn). `version` as cudnn_loaded_version(), `sm` as cuda_sm_version().
std::string cudnn_sdpa_known_limit(int64_t version, int sm, int64_t tq, int64_t tk, int64_t d,
                                   bool causal, bool backward);
// The score a causal mask writes where a key is hidden (Note [cuDNN SDPA], masking): -inf from
// cuDNN 9.10, the lowest finite float before it (what cudnn-frontend passes to older releases).
float cudnn_sdpa_mask_fill(int64_t version);

// Run attention through cuDNN on `stream`, with the backend's tensor contract (tensor/backend.h):
// q [B, H, Tq, D], k, v [B, H, Tk, D], out [B, H, Tq, D] in q's dtype (bf16 or f16), lse
// [B, H, Tq] f32; q, k, v, out (and dout, dq, dk, dv) may be strided views with D stride 1
// (Note [Strided attention operands] in tensor/backend.h). Returns false, without having
// written anything and without throwing, when cuDNN is not built in or not loadable, a tensor is
// f32 / on the host / not 16-byte aligned / has a D stride other than 1 or a B, H or T stride
// that is not a multiple of 8 elements, the shape is outside what is tried (D % 8 != 0, D > 256,
// causal with Tq > Tk), a known cuDNN limit applies (cudnn_sdpa_known_limit), or cuDNN offers
// no plan for it; `why` gets the reason. Plans are cached
// per shape and layout.
// Errors of the GPU caching allocator (out of memory for the workspace) do propagate.
bool cudnn_sdpa_forward(CUstream_st* stream, const Tensor& q, const Tensor& k, const Tensor& v,
                        bool causal, float scale, Tensor& out, Tensor& lse,
                        std::string* why = nullptr);
// dq, dk, dv from q, k, v, out, dout (q's dtype) and lse (f32), deterministically.
bool cudnn_sdpa_backward(CUstream_st* stream, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& dout, bool causal,
                         float scale, Tensor& dq, Tensor& dk, Tensor& dv,
                         std::string* why = nullptr);

// What CudaBackend::attention_forward / _backward do first: under attention_mode() try cuDNN;
// true when cuDNN ran (the caller returns), false when the own kernel must run. Records
// last_attention_path(). Under STRATA_ATTENTION=cudnn a case cuDNN cannot run is a UserError.
// Under auto a decode step's forward (Tq <= 16 < Tk) goes to the own kernel untried (Note
// [cuDNN SDPA], decoding).
bool try_cudnn_attention_forward(CUstream_st* stream, const Tensor& q, const Tensor& k,
                                 const Tensor& v, bool causal, float scale, Tensor& out,
                                 Tensor& lse);
bool try_cudnn_attention_backward(CUstream_st* stream, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, bool causal, float scale, Tensor& dq,
                                  Tensor& dk, Tensor& dv);

}  // namespace strata::tensor::cuda
