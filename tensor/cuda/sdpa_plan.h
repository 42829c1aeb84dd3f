#pragma once
// cuDNN backend-API ("graph") plumbing for fused attention: loading libcudnn, building and
// running the forward and backward SDPA plans of Note [cuDNN SDPA] (cudnn_sdpa.cpp). Internal to
// tensor/cuda; includes no cuDNN header so that callers need none.
#include <compare>
#include <cstdint>
#include <memory>
#include <string>

struct CUstream_st;

namespace strata::tensor::cuda {

// What a plan is specialised on. The scale is not here: it is a by-value input.
struct SdpaKey {
  int64_t b = 0, h = 0, tq = 0, tk = 0, d = 0;
  bool bf16 = true;  // else f16
  bool causal = false;
  bool backward = false;
  auto operator<=>(const SdpaKey&) const = default;
  std::string str() const;
};

// Device pointers of one call (the backward ones unused by the forward) and the scale.
struct SdpaPointers {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *stats = nullptr;
  void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float scale = 1.f;
};

// A finalized execution plan and the descriptors it references.
class SdpaPlan {
 public:
  virtual ~SdpaPlan() = default;
  // Bytes the caller provides per execution (cuDNN's workspace plus, for the backward, the
  // graph's own f32 row-sum tensor).
  virtual int64_t workspace_bytes() const = 0;
  virtual const std::string& engine_name() const = 0;
  // Enqueues the plan on `stream`. false (and `err`) when cuDNN refuses; never throws.
  virtual bool execute(CUstream_st* stream, const SdpaPointers& p, void* workspace,
                       std::string* err) = 0;
};

// Builds the plan for `key` on CUDA device `device`: nullptr (and `err`) when cuDNN has no
// engine for it, is not built in or cannot be loaded. Never throws.
std::shared_ptr<SdpaPlan> build_sdpa_plan(const SdpaKey& key, int device, std::string* err);

}  // namespace strata::tensor::cuda
