// cuDNN fused attention: mode selection, argument checks, the plan cache and execution. The
// backend-API plumbing is in sdpa_plan.cpp, the two operation graphs in sdpa_graph.cpp.
//
// Note [cuDNN SDPA]
// What runs. cuDNN 9 has no single "attention" call on its C API for our case: its flash
// attention engines are chosen by the graph API (cudnn_graph.h) for an operation graph of matmul,
// pointwise and reduction nodes in the shape cudnn_frontend lowers its SDPA node to (the
// "composite" SDPA of cudnn-frontend's node/scaled_dot_product_flash_attention.h). cuDNN also
// has single SDPA_FWD (9.13.1+) and SDPA_BWD (9.17+) operation nodes, but they take a causal mask
// only as a score-modifier subgraph, which needs 9.21; so Strata builds the composite graphs
// itself (sdpa_graph.cpp; the cudnn_frontend C++ headers are not used). Forward:
//   S = Q K^T * scale [causal: S = select(row + Tk - Tq >= col, S, fill), fill = -inf]
//   M = rowmax S,  E = exp(S - M),  L = rowsum E,  Stats = M + log L,  O = (E / L) V
// Backward (Stats from the forward, D = rowsum(dO * O)):
//   P = exp(Q K^T * scale - Stats) [masked the same way],  dV = P^T dO,
//   dS = P * (dO V^T - D) * scale,  dK = dS^T Q,  dQ = dS K.
// bf16 and f16 only (cuDNN flash attention has no f32 path): f32 inputs use the own kernel.
//
// The lse contract. backend.h wants lse = the natural log-sum-exp of each scaled (and masked)
// score row. cuDNN's Stats is exactly that: Stats = max + log(sum exp(s - max)) with natural
// log (cudnn-frontend include/cudnn_frontend/node/softmax.h, CompositeSoftmaxNode, which is the
// graph the engines match; NVIDIA's SDPA docs, e.g.
// https://docs.nvidia.com/cudnn/operations/Attention/sdpa_bwd_sm107, call it "the forward Stats
// (natural-log LSE)"; a base-2 variant exists only as an opt-in attribute of cuDNN >= 9.27, not
// set here). Stats is f32 [B, H, Tq, 1] packed, the same bytes as our contiguous lse [B, H, Tq],
// so both directions pass our lse pointer with no conversion, and an lse from the own kernel
// feeds cuDNN's backward and vice versa.
//
// Masking. Our causal mask lets query i see keys j <= i + (Tk - Tq) (bottom-right aligned). With
// Tq == Tk that is cuDNN's plain causal graph (row >= col); with Tq < Tk the row index is shifted
// by by-value scalars (+Tk, -Tq) as cudnn-frontend's bottom-right mask does. A hidden score
// becomes a by-value fill: -inf from cuDNN 9.10, the lowest finite float before it, as
// cudnn-frontend chooses ("older cuDNN version prefers lowest for softmax mask";
// cudnn_sdpa_mask_fill). Either gives exp() = 0 for every row our graphs build, since each row
// sees at least one key. Tq > Tk with causal
// leaves rows with no key, which our contract defines (out 0, lse -inf) and cuDNN does not: those
// go to the own kernel.
//
// Determinism (docs/design.md decision 9). cuDNN's stock SDPA backward accumulates dQ with atomics
// into an f32 workspace tensor (cudnn-frontend's "dQ_accum" graph: matmul dS K into a non-virtual
// f32 tensor, then an IDENTITY node into dQ), so its dQ bits depend on scheduling. The graph
// without that tensor (matmul dS K straight into dQ) makes the Hopper engine keep dP in a
// workspace of B*H*Tq*Tk*2 bytes and reduce dQ in a fixed order; cudnn-frontend selects exactly
// that graph when asked for is_deterministic_algorithm on Hopper. Strata always builds the
// deterministic graph (there is no non-deterministic variant to select), and additionally skips
// any engine config whose numerical notes say NONDETERMINISTIC. The cost is that workspace
// (GPT-2 124M at B = 16, T = 1024: 12 heads -> 384 MiB) and some speed; auto therefore keeps
// using cuDNN for the backward. CudnnAttention.CudnnAttentionIsDeterministic (tests/cuda) checks
// the bits.
//
// Loading. libcudnn.so.9 is opened with dlopen on first use, not linked: a binary built here
// must still start on a machine without cuDNN, and there cuDNN is simply unavailable. Any 9.x
// runtime is accepted (the backend API's enums are stable within a major version; all the
// graph uses exists since 9.0); the loaded version is logged once.
//
// Known limits. Some shapes the graphs describe are outside what a given cuDNN release runs
// correctly on a given GPU; cudnn_sdpa_known_limit sends those to the own kernel before any plan
// is built (Note [cuDNN SDPA limits] below).
//
// Caching. A plan is built once per (B, H, Tq, Tk, D, dtype, causal, direction, operand strides)
// and kept for the process; the scale is a by-value input of the graph, so one plan serves every
// scale. A shape cuDNN cannot plan is remembered too (one log line, then straight to the own
// kernel).
// Decoding. Under auto a forward with a few queries against more keys (Tq <= 16 < Tk: a decode
// step against a KV cache, Note [KV cache] in models/kv_cache.h) goes to the own kernels (Note
// [CUDA decode attention] in attention_decode.cu for head dims 32, 64 and 128) without
// trying cuDNN: each step has another Tk, so every generated token would build and keep a plan of
// its own, and building one costs far more than the attention of a few queries. STRATA_ATTENTION=
// cudnn still sends them to cuDNN.
//
// Layout. Q, K, V, O, dO, dQ, dK, dV are described with their real strides (Note [Strided
// attention operands] in tensor/backend.h), as cudnn-frontend and PyTorch describe BSHD views of
// a packed QKV buffer; K and V enter the matmuls as [B, H, D, Tk] views of the same memory
// (strides permuted), as cudnn-frontend's reshape of K does. Tried only when each base pointer
// is 16-byte aligned and each B, H, T stride is a multiple of 8 elements; else the own kernel.
#include "tensor/cuda/cudnn_sdpa.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "offload/memory_stats.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/sdpa_plan.h"

namespace strata::tensor::cuda {

namespace {

thread_local AttentionPath g_last_path = AttentionPath::None;

// One line per distinct reason: the first time a shape falls back is news, the next thousand
// steps are not.
void log_once(bool important, const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(msg).second) return;
  if (important)
    log::info("attention: {}", msg);
  else
    log::debug("attention: {}", msg);
}

bool fail(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

// Checks shared by both directions; `io` are the q-dtype tensors, lse the f32 one.
bool check_args(const Tensor& q, const Tensor& k, const std::vector<const Tensor*>& io,
                const Tensor& lse, bool causal, std::string* why) {
  if (q.dtype() != DType::BF16 && q.dtype() != DType::F16)
    return fail(why, fmt::format("dtype {}: cuDNN flash attention takes bf16 or f16 inputs",
                                 dtype_name(q.dtype())));
  for (const Tensor* t : io) {
    if (!t->device().is_cuda())
      return fail(why, fmt::format("{} is not on a CUDA device", t->str()));
    if (t->dtype() != q.dtype())
      return fail(why, fmt::format("mixed dtypes ({} and {})", dtype_name(q.dtype()),
                                   dtype_name(t->dtype())));
    if (t->ndim() != 4 || t->stride(3) != 1)
      return fail(why, fmt::format("{} is not a [B, H, T, D] view with D stride 1", t->str()));
    // Strided operands (Note [Strided attention operands]): every row must start 16-byte
    // aligned, as the packed ones do when D % 8 == 0.
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      return fail(why, fmt::format("{} is not 16-byte aligned", t->str()));
    for (int dim = 0; dim < 3; ++dim)
      if (t->stride(dim) % 8 != 0)
        return fail(why, fmt::format("{} has a stride that is not a multiple of 8 elements "
                                     "(16 bytes)",
                                     t->str()));
  }
  if (lse.dtype() != DType::F32 || !lse.device().is_cuda() || !lse.is_contiguous() ||
      reinterpret_cast<uintptr_t>(lse.data_ptr()) % 16 != 0)
    return fail(why, fmt::format("lse {} is not a contiguous, aligned f32 CUDA tensor", lse.str()));
  const int64_t d = q.size(3), tq = q.size(2), tk = k.size(2);
  if (q.numel() == 0 || k.numel() == 0) return fail(why, "empty attention");
  if (d % 8 != 0 || d > 256)
    return fail(why, fmt::format("head dim {} (cuDNN needs a multiple of 8, at most 256)", d));
  if (causal && tq > tk)
    return fail(why, fmt::format("causal with Tq {} > Tk {} leaves rows with no key", tq, tk));
  return true;
}

// `io` in SdpaOperand order: q, k, v, out[, dout, dq, dk, dv].
SdpaKey key_of(const Tensor& q, const Tensor& k, bool causal, bool backward,
               const std::vector<const Tensor*>& io) {
  SdpaKey key{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), q.dtype() == DType::BF16,
              causal,    backward};
  for (size_t i = 0; i < io.size(); ++i)
    key.strides[i] = {io[i]->stride(0), io[i]->stride(1), io[i]->stride(2)};
  return key;
}

// The plan cache: one entry per key, nullptr for a key cuDNN could not plan (with its reason).
struct Cache {
  std::mutex mu;  // also serialises execution: one handle, its stream set per call
  std::map<SdpaKey, std::shared_ptr<SdpaPlan>> plans;
  std::map<SdpaKey, std::string> failures;
};

Cache& cache() {
  static Cache* c = new Cache();  // lives for the process, like the backend
  return *c;
}

// The plan for `key`, building it on first use. nullptr (and `why`) when cuDNN cannot.
std::shared_ptr<SdpaPlan> plan_for(const SdpaKey& key, int device, std::string* why) {
  Cache& c = cache();
  if (auto it = c.plans.find(key); it != c.plans.end()) return it->second;
  if (auto it = c.failures.find(key); it != c.failures.end()) {
    fail(why, it->second);
    return nullptr;
  }
  std::string err;
  std::shared_ptr<SdpaPlan> plan = build_sdpa_plan(key, device, &err);
  if (!plan) {
    err = fmt::format("cuDNN has no {} plan for {}: {}", key.backward ? "backward" : "forward",
                      key.str(), err);
    log_once(true, err + "; using Strata's own kernel");
    c.failures[key] = err;
    fail(why, err);
    return nullptr;
  }
  log::info("attention: cuDNN {} plan for {} (engine {}, workspace {} bytes)",
            key.backward ? "backward" : "forward", key.str(), plan->engine_name(),
            plan->workspace_bytes());
  c.plans[key] = plan;
  return plan;
}

// Workspace for one execution, charged to Category::Workspace on the backend's allocator.
// Freed when the caller returns: the allocator reuses it only in this stream's order
// (Note [GPU caching allocator]).
Tensor workspace(int64_t bytes, Device device) {
  offload::CategoryScope ws(offload::Category::Workspace);
  return Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::U8, device);
}

bool run(const SdpaKey& key, CUstream_st* stream, const Tensor& q, const SdpaPointers& ptrs,
         std::string* why) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  std::shared_ptr<SdpaPlan> plan = plan_for(key, q.device().index, why);
  if (!plan) return false;
  Tensor ws = workspace(plan->workspace_bytes(), q.device());
  std::string err;
  if (!plan->execute(stream, ptrs, ws.data_ptr(), &err)) {
    // A plan that finalized but does not execute is not expected; do not try it again.
    err = fmt::format("cuDNN {} for {} failed to execute: {}",
                      key.backward ? "backward" : "forward", key.str(), err);
    log::warn("attention: {}; using Strata's own kernel from now on for this shape", err);
    c.plans.erase(key);
    c.failures[key] = err;
    return fail(why, err);
  }
  return true;
}

}  // namespace

std::string SdpaKey::str() const {
  std::string s = fmt::format("B={} H={} Tq={} Tk={} D={} {}{}", b, h, tq, tk, d,
                              bf16 ? "bf16" : "f16", causal ? " causal" : "");
  // The layout, when an operand is a strided view rather than packed.
  static constexpr const char* kNames[] = {"q", "k", "v", "o", "do", "dq", "dk", "dv"};
  std::string strided;
  for (int i = 0; i < (backward ? 8 : 4); ++i) {
    const bool on_k = i == kSdpaK || i == kSdpaV || i == kSdpaDK || i == kSdpaDV;
    if (strides[i] != packed(on_k ? tk : tq))
      strided +=
          fmt::format(" {}={},{},{}", kNames[i], strides[i][0], strides[i][1], strides[i][2]);
  }
  if (!strided.empty()) s += " strides" + strided;
  return s;
}

AttentionMode attention_mode() {
  static constexpr AttentionMode kModes[] = {AttentionMode::Auto, AttentionMode::Own,
                                             AttentionMode::Simt, AttentionMode::Cudnn};
  return kModes[env_choice(
      "STRATA_ATTENTION",
      {{"auto", "cuDNN where it can run, else the own kernels"},
       {"own",
        "Strata's kernels: the split-key decode kernel for decode steps, tensor cores for "
        "bf16/f16 with head dim 64 or 128, else the SIMT kernel"},
       {"simt", "Strata's SIMT kernel only"},
       {"cudnn", "cuDNN flash attention, an error where it cannot run"}})];
}

AttentionPath last_attention_path() {
  return g_last_path;
}

void set_last_attention_path(AttentionPath path) {
  g_last_path = path;
}

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::None:
      return "none";
    case AttentionPath::Own:
      return "own";
    case AttentionPath::OwnTensorCore:
      return "own-tc";
    case AttentionPath::OwnDecode:
      return "own-decode";
    case AttentionPath::Cudnn:
      return "cudnn";
  }
  return "?";
}

// Note [cuDNN SDPA limits]
// What cuDNN's fused attention does not run (correctly) although the graph describes it, by cuDNN
// release and architecture. Learned from the support-surface checks that cudnn-frontend runs
// before it lowers its SDPA nodes (include/cudnn_frontend/node/sdpa_support_surface.h and the
// composite backward node in scaled_dot_product_flash_attention.h); each rule names its source
// condition. They are checked here rather than left to plan finalization because some of them
// are wrong results, not refusals:
//   - sm < 80: no flash attention engine.
//   - 9.10.0 and 9.10.1: known SDPA bugs, forward and backward.
//   - head dim: at most 256 on Hopper; at most 128 for the backward elsewhere (Ampere, Ada,
//     sm_12x; Blackwell sm_10x also takes 256 from 9.23), and for the forward on Ampere and
//     Blackwell with cuDNN up to 9.9 / 9.8.
//   - a backward with s_kv not a multiple of 128 on cuDNN <= 9.15.0: cudnn-frontend adds a
//     padding mask (seq_len tensors equal to the full lengths) as a workaround; Strata's graph
//     has none, so those shapes use the own kernel.
//   - bottom-right causal (Tq < Tk): none before 9.3; before 9.6 Tq and Tk multiples of 64.
//   - the backward with Tq = Tk = 1.
//   - a deterministic backward on Blackwell (sm_10x) needs 9.18.
// GPT-2 and LLaMA training shapes (D 64 or 128, T 1024 or 2048, causal, Tq = Tk) meet none of
// these on sm_80/sm_90 with any 9.x except 9.10.0/9.10.1. The rules are tested on the CPU
// (CudnnAttention.KnownLimitsFollowVersionAndArchitecture); STRATA_CUDA_EMU_CUDNN_VERSION makes
// the emulated cuDNN report an older release, so CudnnAttention.AKnownLimitGoesToTheOwnKernel
// sees the fallback happen end to end.
std::string cudnn_sdpa_known_limit(int64_t version, int sm, int64_t tq, int64_t tk, int64_t d,
                                   bool causal, bool backward) {
  const char* dir = backward ? "backward" : "forward";
  const int major = sm / 10;
  const auto ver = [](int64_t v) {
    return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  };
  if (sm < 80)
    return fmt::format("cuDNN flash attention needs sm_80 or newer (this GPU: sm_{})", sm);
  if (version == 91000 || version == 91001)
    return fmt::format("cuDNN {} has known bugs in its bf16/f16 attention {}; use 9.10.2 or newer",
                       ver(version), dir);
  if (backward) {
    int64_t max_d = 128;
    if (major == 9 || (major == 10 && version >= 92300)) max_d = 256;
    if (d > max_d)
      return fmt::format("cuDNN {}'s attention backward takes head dim at most {} on sm_{} (D {})",
                         ver(version), max_d, sm, d);
    if (tq == 1 && tk == 1) return "cuDNN's attention backward does not take Tq = Tk = 1";
    if (version <= 91500 && tk % 128 != 0)
      return fmt::format(
          "cuDNN {}'s attention backward needs Tk a multiple of 128 without a padding mask "
          "(Tk {}; fixed after 9.15.0)",
          ver(version), tk);
    if (major == 10 && version < 91800)
      return fmt::format("cuDNN {} has no deterministic attention backward on sm_{} (9.18+)",
                         ver(version), sm);
  } else {
    if (d > 128 && ((major == 8 && version <= 90900) || (major == 10 && version < 90900)))
      return fmt::format("cuDNN {}'s attention forward takes head dim at most 128 on sm_{} (D {})",
                         ver(version), sm, d);
  }
  if (causal && tq != tk && version < 90300)
    return fmt::format("cuDNN {} has no bottom-right causal mask (Tq {} < Tk {}; 9.3+)",
                       ver(version), tq, tk);
  if (causal && tq != tk && version < 90600 && (tq % 64 != 0 || tk % 64 != 0))
    return fmt::format(
        "cuDNN {}'s bottom-right causal mask needs Tq and Tk multiples of 64 (Tq {}, Tk {})",
        ver(version), tq, tk);
  return "";
}

float cudnn_sdpa_mask_fill(int64_t version) {
  return version < 91000 ? std::numeric_limits<float>::lowest()
                         : -std::numeric_limits<float>::infinity();
}

int cuda_sm_version(int device) {
  static std::array<std::atomic<int>, 64> cached{};  // 0: not read yet (or unreadable)
  if (device < 0 || device >= static_cast<int>(cached.size())) return 0;
  if (int sm = cached[device].load(); sm != 0) return sm;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int sm = prop.major * 10 + prop.minor;
  cached[device].store(sm);
  return sm;
}

namespace {

// The known limit for this call, or "" (Note [cuDNN SDPA limits]).
std::string known_limit(const Tensor& q, const Tensor& k, bool causal, bool backward) {
  return cudnn_sdpa_known_limit(cudnn_loaded_version(), cuda_sm_version(q.device().index),
                                q.size(2), k.size(2), q.size(3), causal, backward);
}

}  // namespace

bool cudnn_sdpa_forward(CUstream_st* stream, const Tensor& q, const Tensor& k, const Tensor& v,
                        bool causal, float scale, Tensor& out, Tensor& lse, std::string* why) {
  if (!check_args(q, k, {&q, &k, &v, &out}, lse, causal, why)) return false;
  if (!cudnn_loaded(why)) return false;
  if (std::string limit = known_limit(q, k, causal, false); !limit.empty())
    return fail(why, std::move(limit));
  SdpaPointers p;
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = out.data_ptr();
  p.stats = lse.data_ptr();
  p.scale = scale;
  return run(key_of(q, k, causal, false, {&q, &k, &v, &out}), stream, q, p, why);
}

bool cudnn_sdpa_backward(CUstream_st* stream, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& dout, bool causal,
                         float scale, Tensor& dq, Tensor& dk, Tensor& dv, std::string* why) {
  if (!check_args(q, k, {&q, &k, &v, &out, &dout, &dq, &dk, &dv}, lse, causal, why)) return false;
  if (!cudnn_loaded(why)) return false;
  if (std::string limit = known_limit(q, k, causal, true); !limit.empty())
    return fail(why, std::move(limit));
  SdpaPointers p;
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.o = out.data_ptr();
  p.stats = lse.data_ptr();
  p.dout = dout.data_ptr(), p.dq = dq.data_ptr(), p.dk = dk.data_ptr(), p.dv = dv.data_ptr();
  p.scale = scale;
  return run(key_of(q, k, causal, true, {&q, &k, &v, &out, &dout, &dq, &dk, &dv}), stream, q, p,
             why);
}

namespace {

// The shared tail of the two try_ functions.
bool after_attempt(bool ran, AttentionMode mode, const char* direction, const std::string& why) {
  if (ran) {
    set_last_attention_path(AttentionPath::Cudnn);
    return true;
  }
  if (mode == AttentionMode::Cudnn)
    user_error(
        "STRATA_ATTENTION=cudnn, but cuDNN cannot run this attention {}: {}. Unset "
        "STRATA_ATTENTION (or set it to auto) to fall back to Strata's own kernel",
        direction, why);
  // f32 is the own kernel's normal case, not news; anything else is worth one line.
  log_once(why.rfind("dtype f32", 0) != 0,
           fmt::format("{} uses Strata's own kernel: {}", direction, why));
  set_last_attention_path(AttentionPath::Own);
  return false;
}

}  // namespace

bool try_cudnn_attention_forward(CUstream_st* stream, const Tensor& q, const Tensor& k,
                                 const Tensor& v, bool causal, float scale, Tensor& out,
                                 Tensor& lse) {
  const AttentionMode mode = attention_mode();
  if (mode == AttentionMode::Own || mode == AttentionMode::Simt) {
    set_last_attention_path(AttentionPath::Own);
    return false;
  }
  if (mode == AttentionMode::Auto && q.size(2) <= kAttentionDecodeQueries &&
      q.size(2) < k.size(2)) {
    set_last_attention_path(AttentionPath::Own);  // a decode step (Note [cuDNN SDPA], decoding)
    return false;
  }
  std::string why;
  const bool ran = cudnn_sdpa_forward(stream, q, k, v, causal, scale, out, lse, &why);
  return after_attempt(ran, mode, "forward", why);
}

bool try_cudnn_attention_backward(CUstream_st* stream, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, bool causal, float scale, Tensor& dq,
                                  Tensor& dk, Tensor& dv) {
  const AttentionMode mode = attention_mode();
  if (mode == AttentionMode::Own || mode == AttentionMode::Simt) {
    set_last_attention_path(AttentionPath::Own);
    return false;
  }
  std::string why;
  const bool ran =
      cudnn_sdpa_backward(stream, q, k, v, out, lse, dout, causal, scale, dq, dk, dv, &why);
  return after_attempt(ran, mode, "backward", why);
}

}  // namespace strata::tensor::cuda
