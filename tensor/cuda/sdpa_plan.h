#pragma once
// cuDNN backend-API ("graph") plumbing for fused attention: loading libcudnn, building and
// running the forward and backward SDPA plans of Note [cuDNN SDPA] (cudnn_sdpa.cpp). Internal to
// tensor/cuda; includes no cuDNN header so that callers need none.
#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>

struct CUstream_st;

namespace strata::tensor::cuda {

// The operands of the graphs, in the order of SdpaKey::strides.
enum SdpaOperand : int { kSdpaQ = 0, kSdpaK, kSdpaV, kSdpaO, kSdpaDO, kSdpaDQ, kSdpaDK, kSdpaDV };

// What a plan is specialised on. The scale is not here: it is a by-value input.
struct SdpaKey {
  int64_t b = 0, h = 0, tq = 0, tk = 0, d = 0;
  bool bf16 = true;  // else f16
  bool causal = false;
  bool backward = false;
  // The (B, H, T) element strides of each operand, indexed by SdpaOperand; D's stride is 1
  // (Note [Strided attention operands] in tensor/backend.h). All zero for the operands of the
  // backward in a forward key.
  std::array<std::array<int64_t, 3>, 8> strides{};
  auto operator<=>(const SdpaKey&) const = default;
  std::string str() const;
  // The packed [B, H, T, D] strides of an operand with `t` rows per head.
  std::array<int64_t, 3> packed(int64_t t) const { return {h * t * d, t * d, d}; }
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

// Note [Deviceless cuDNN plans]
// cuDNN (9.8 on) builds execution plans for a GPU that is not there: a device-properties
// descriptor made from JSON (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, the form cuDNN itself
// serializes a device's properties to) stands in for the handle in the engine heuristics and the
// plan, and the operation graph takes no handle. The loaded cuDNN then runs its whole path for
// `key`'s graph - its support checks, heuristics, the engine's own checks and the kernel's
// compilation - except loading the compiled kernel, which needs a CUDA driver: on a machine
// without one, give cuDNN a stand-in libcuda.so.1 (tests/cudnn_deviceless/stub_libcuda.cpp).
// What it shows: whether a real cuDNN accepts Strata's graphs for that GPU, which engine it
// takes and the workspace it asks for. Not whether the plan runs or computes the right values.
struct DevicelessSdpaPlan {
  std::string engine;           // as SdpaPlan::engine_name
  int64_t workspace_bytes = 0;  // as SdpaPlan::workspace_bytes
};
// true and `out` when cuDNN finalized a plan for the GPU `device_properties_json` describes;
// false and `err` (cuDNN's reasons per engine config) when not. Never throws.
bool build_sdpa_plan_deviceless(const SdpaKey& key, const std::string& device_properties_json,
                                DevicelessSdpaPlan* out, std::string* err);

}  // namespace strata::tensor::cuda
