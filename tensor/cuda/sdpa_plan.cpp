// cuDNN backend-API plumbing for fused attention: loading libcudnn (dlopen), descriptors, the
// engine choice and execution of the graphs of sdpa_graph.cpp. The graphs and why they
// look like this: Note [cuDNN SDPA] in cudnn_sdpa.cpp.
#include "tensor/cuda/sdpa_plan.h"

#include "core/logging.h"
#include "tensor/cuda/cudnn_sdpa.h"

#if STRATA_HAVE_CUDNN

#include <cuda_runtime.h>
#include <cudnn_graph.h>
#include <dlfcn.h>

#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "tensor/cuda/sdpa_graph.h"

namespace strata::tensor::cuda {

const Api* g_api = nullptr;

void ck(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  g_api->last_error(detail, sizeof(detail));
  throw CudnnError(
      fmt::format("{}: {}{}{}", what, g_api->error_string(s), detail[0] ? ": " : "", detail));
}

namespace {
std::string g_load_error;

void load_once() {
  static std::once_flag once;
  std::call_once(once, [] {
#if STRATA_CUDA_EMULATION
    // The CUDA emulator's cuDNN (Note [Emulated cuDNN], cuda_emu/cudnn.cpp) is linked in.
    g_api = new Api{&::cudnnGetVersion,
                    &::cudnnCreate,
                    &::cudnnSetStream,
                    &::cudnnGetErrorString,
                    &::cudnnGetLastErrorString,
                    &::cudnnBackendCreateDescriptor,
                    &::cudnnBackendDestroyDescriptor,
                    &::cudnnBackendSetAttribute,
                    &::cudnnBackendGetAttribute,
                    &::cudnnBackendFinalize,
                    &::cudnnBackendExecute};
    return;
#endif
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", e ? e : name);
    }
    if (!lib) {
      g_load_error = fmt::format(
          "libcudnn.so.9 could not be loaded ({}); put cuDNN 9's lib folder on LD_LIBRARY_PATH",
          tried);
      return;
    }
    auto* a = new Api();  // lives for the process, like the library
    std::string missing;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) missing += fmt::format(" {}", name);
    };
    sym(a->get_version, "cudnnGetVersion");
    sym(a->create, "cudnnCreate");
    sym(a->set_stream, "cudnnSetStream");
    sym(a->error_string, "cudnnGetErrorString");
    sym(a->last_error, "cudnnGetLastErrorString");
    sym(a->create_desc, "cudnnBackendCreateDescriptor");
    sym(a->destroy_desc, "cudnnBackendDestroyDescriptor");
    sym(a->set_attr, "cudnnBackendSetAttribute");
    sym(a->get_attr, "cudnnBackendGetAttribute");
    sym(a->finalize, "cudnnBackendFinalize");
    sym(a->execute, "cudnnBackendExecute");
    if (!missing.empty()) {
      g_load_error = fmt::format("the loaded libcudnn lacks{}", missing);
      return;
    }
    const size_t v = a->get_version();
    if (v < 90000 || v >= 100000) {
      g_load_error = fmt::format(
          "the loaded libcudnn is version {}; the graph API used needs 9.x "
          "(built against {}.{}.{})",
          v, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
      return;
    }
    log::info("attention: cuDNN {}.{}.{} loaded (built against {}.{}.{})", v / 10000, v / 100 % 100,
              v % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    g_api = a;
  });
}

cudnnHandle_t handle_for(int device) {
  static cudnnHandle_t h = nullptr;  // one process per GPU (docs/design.md decision 10)
  if (!h) {
    if (cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      throw CudnnError(fmt::format("cudaSetDevice({}) failed", device));
    }
    ck(g_api->create(&h), "cudnnCreate");
  }
  return h;
}

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

class SdpaPlanImpl final : public SdpaPlan {
 public:
  int64_t workspace_bytes() const override { return row_sum_bytes + cudnn_workspace; }
  const std::string& engine_name() const override { return engine; }

  bool execute(CUstream_st* stream, const SdpaPointers& p, void* workspace,
               std::string* err) override {
    try {
      ck(g_api->set_stream(handle, stream), "cudnnSetStream");
      // By-value inputs: host values, read when the plan is enqueued.
      float scale = p.scale, one = 1.f;
      float neg_inf = cudnn_sdpa_mask_fill(static_cast<int64_t>(g_api->get_version()));
      int32_t skv = static_cast<int32_t>(key.tk), sq = static_cast<int32_t>(key.tq);
      char* ws = static_cast<char*>(workspace);
      std::array<void*, kRowSum + 1> by_uid{};
      by_uid[kQ] = p.q, by_uid[kK] = p.k, by_uid[kV] = p.v, by_uid[kO] = p.o;
      by_uid[kStats] = p.stats, by_uid[kDO] = p.dout;
      by_uid[kDQ] = p.dq, by_uid[kDK] = p.dk, by_uid[kDV] = p.dv;
      by_uid[kScale] = &scale, by_uid[kNegInf] = &neg_inf, by_uid[kOne] = &one;
      by_uid[kSkv] = &skv, by_uid[kSq] = &sq, by_uid[kRowSum] = ws;
      std::vector<void*> ptrs;
      for (int64_t uid : graph.bound) {
        if (uid <= 0 || uid > kRowSum || !by_uid[uid])
          throw CudnnError(fmt::format("no pointer for graph tensor {}", uid));
        ptrs.push_back(by_uid[uid]);
      }
      void* cudnn_ws = cudnn_workspace > 0 ? ws + row_sum_bytes : nullptr;
      Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      const auto n = static_cast<int64_t>(ptrs.size());
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, graph.bound.data());
      pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data());
      pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_ws);
      pack.finalize("variant pack");
      ck(g_api->execute(handle, plan->get(), pack.get()), "cudnnBackendExecute");
      return true;
    } catch (const CudnnError& e) {
      if (err) *err = e.what();
      return false;
    }
  }

  SdpaKey key;
  cudnnHandle_t handle = nullptr;
  GraphBuilder graph;
  std::unique_ptr<Desc> plan;
  int64_t row_sum_bytes = 0, cudnn_workspace = 0;
  std::string engine;
};

bool nondeterministic(cudnnBackendDescriptor_t engine) {
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t n = 0;
  ck(g_api->get_attr(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                     static_cast<int64_t>(notes.size()), &n, notes.data()),
     "engine numerical notes");
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(notes.size()); ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

// The first engine config (heuristics mode A, then the fallback list) that finalizes into a
// plan; a backward one must not be marked non-deterministic. When none does, the error lists
// what each config said. For s.handle's GPU, or, with `device`, for the GPU a device-properties
// descriptor describes (Note [Deviceless cuDNN plans]).
void choose_plan(SdpaPlanImpl& s, cudnnBackendDescriptor_t graph,
                 cudnnBackendDescriptor_t device = nullptr) {
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback";
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (device) heur.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device);
    try {
      heur.finalize("engine heuristics");
    } catch (const CudnnError& e) {
      tried += fmt::format("[{}: {}] ", mode_name, e.what());
      continue;
    }
    int64_t count = 0;
    ck(g_api->get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                       &count, nullptr),
       "engine heuristics result count");
    std::vector<std::unique_ptr<Desc>> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    int64_t got = 0;
    if (count > 0)
      ck(g_api->get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                         count, &got, raw.data()),
         "engine heuristics results");
    tried += fmt::format("[{}: {} configs", mode_name, got);
    for (int64_t i = 0; i < got; ++i) {
      try {
        Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        cudnnBackendDescriptor_t e = engine.get();
        int64_t one = 0;
        ck(g_api->get_attr(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                           &one, &e),
           "engine of config");
        int64_t index = -1;
        ck(g_api->get_attr(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one, &index),
           "engine index");
        if (s.key.backward && nondeterministic(e)) {
          tried += fmt::format("; engine {} skipped (non-deterministic)", index);
          continue;
        }
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        if (device)
          plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device);
        else
          plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &s.handle);
        plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
        plan->finalize("execution plan");
        int64_t ws = 0;
        ck(g_api->get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                           1, &one, &ws),
           "plan workspace size");
        s.plan = std::move(plan);
        s.cudnn_workspace = ws;
        s.engine = fmt::format("{} ({} #{})", index, mode_name, i);
        return;
      } catch (const CudnnError& e) {
        tried += fmt::format("; config {}: {}", i, e.what());
      }
    }
    tried += "] ";
  }
  throw CudnnError(fmt::format("no engine config finalized: {}", tried));
}

}  // namespace

bool cudnn_built() {
  return true;
}

bool cudnn_loaded(std::string* why) {
  load_once();
  if (!g_api && why) *why = g_load_error;
  return g_api != nullptr;
}

int64_t cudnn_loaded_version() {
  load_once();
  return g_api ? static_cast<int64_t>(g_api->get_version()) : 0;
}

namespace {

// The operations of `key`'s graph: each is validated when finalized, with no device needed.
std::shared_ptr<SdpaPlanImpl> operations_of(const SdpaKey& key) {
  auto s = std::make_shared<SdpaPlanImpl>();
  s->key = key;
  if (key.backward) {
    build_backward(s->graph, key);
    s->row_sum_bytes = align256(key.b * key.h * key.tq * static_cast<int64_t>(sizeof(float)));
  } else {
    build_forward(s->graph, key);
  }
  return s;
}

}  // namespace

std::shared_ptr<SdpaPlan> build_sdpa_plan(const SdpaKey& key, int device, std::string* err) {
  if (!cudnn_loaded(err)) return nullptr;
  try {
    auto s = operations_of(key);
    s->handle = handle_for(device);
    Desc& graph = s->graph.finalize_graph(s->handle);
    choose_plan(*s, graph.get());
    return s;
  } catch (const CudnnError& e) {
    if (err) *err = e.what();
    return nullptr;
  }
}

bool build_sdpa_plan_deviceless(const SdpaKey& key, const std::string& device_properties_json,
                                DevicelessSdpaPlan* out, std::string* err) {
  if (!cudnn_loaded(err)) return false;
  const int64_t version = static_cast<int64_t>(g_api->get_version());
  if (version < 90800) {
    if (err)
      *err = fmt::format("cuDNN {} builds no plan without a device (deviceless plans: 9.8 on)",
                         version);
    return false;
  }
  try {
    Desc device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
               static_cast<int64_t>(device_properties_json.size()), device_properties_json.data());
    device.finalize("device properties");
    auto s = operations_of(key);
    Desc& graph = s->graph.finalize_graph(nullptr);
    choose_plan(*s, graph.get(), device.get());
    if (out) {
      out->engine = s->engine;
      out->workspace_bytes = s->workspace_bytes();
    }
    return true;
  } catch (const CudnnError& e) {
    if (err) *err = e.what();
    return false;
  }
}

}  // namespace strata::tensor::cuda

#else  // !STRATA_HAVE_CUDNN

namespace strata::tensor::cuda {

namespace {
constexpr const char* kNotBuilt =
    "this binary was built without cuDNN (the configure line printed cuDNN=OFF: no cudnn.h next "
    "to the CUDA toolkit)";
}

bool cudnn_built() {
  return false;
}

bool cudnn_loaded(std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}

int64_t cudnn_loaded_version() {
  return 0;
}

std::shared_ptr<SdpaPlan> build_sdpa_plan(const SdpaKey&, int, std::string* err) {
  if (err) *err = kNotBuilt;
  return nullptr;
}

bool build_sdpa_plan_deviceless(const SdpaKey&, const std::string&, DevicelessSdpaPlan*,
                                std::string* err) {
  if (err) *err = kNotBuilt;
  return false;
}

}  // namespace strata::tensor::cuda

#endif  // STRATA_HAVE_CUDNN
