// The cuDNN graph API of the emulated device: descriptors, operation graphs made of the nodes
// Strata's fused attention uses, and an interpreter that runs them.
//
// Note [Emulated cuDNN]
// cuDNN's engines are closed; what the backend API documents is the graph: tensors (data type,
// dims, strides, uid, virtual or not, by value or not) and operation nodes between them. This
// emulator accepts the nodes tensor/cuda/sdpa_graph.cpp builds (pointwise ADD, SUB, MUL, DIV,
// EXP, LOG, IDENTITY, CMP_GE, BINARY_SELECT, GEN_INDEX; reductions ADD and MAX; batched matmul;
// reshape) and executes a finalized graph node by node, in dependency order, on the CPU:
//   - Every value is computed in f32. A virtual tensor of a 16-bit type rounds what is written
//     to it (as an engine that keeps P in bf16 for the second matmul does); non-virtual tensors
//     are read and written in device memory at their dims and strides.
//   - A reshape's output is its input's storage seen through the output's dims and strides (the
//     same bytes), which is how a transpose is described.
//   - Broadcasting: an input dim of 1 against a larger output dim. A reduction reduces the dims
//     where the output has 1. A matmul is [.., M, K] x [.., K, N] -> [.., M, N] over equal
//     batch dims. Anything else fails to finalize with CUDNN_STATUS_BAD_PARAM and a message
//     (cudnnGetLastErrorString), as would a graph no engine supports.
//   - Heuristics return one engine config (global index 0, no numerical notes); its plan asks for
//     a workspace of 4 bytes per row of the first reduction's output (0 without one), plus, for
//     an attention backward (five matmuls), the dP workspace a deterministic engine keeps
//     (2 bytes per score, B*H*ceil64(Tq)*ceil64(Tk)*2); execution checks it is inside device
//     memory.
//   - cudnnBackendExecute checks the variant pack (every non-virtual uid bound, device pointers
//     inside one allocation for their extent), reads by-value inputs from the host at the call,
//     and enqueues the run on the handle's stream (Note [Emulated streams]).
// What this does not show: whether a real engine supports the graph, and the engines' own
// arithmetic (summation order, exp approximations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/cudnn_graph.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/simt.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu::emu_cudnn {

namespace {

thread_local std::string t_last_message;

std::mutex g_mu;
std::unordered_set<Descriptor*> g_descs;

size_t attr_bytes(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(void*);
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
      return 8;
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_DATA_TYPE:
      return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_POINTWISE_MODE:
      return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
      return sizeof(cudnnReduceTensorOp_t);
    case CUDNN_TYPE_HEUR_MODE:
      return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_NUMERICAL_NOTE:
      return sizeof(cudnnBackendNumericalNote_t);
    case CUDNN_TYPE_FLOAT:
    case CUDNN_TYPE_INT32:
      return 4;
    default:
      return 0;
  }
}

}  // namespace

cudnnStatus_t bad(cudnnStatus_t s, std::string msg) {
  t_last_message = std::move(msg);
  return s;
}

Descriptor* desc_of(cudnnBackendDescriptor_t d) {
  auto* p = static_cast<Descriptor*>(d);
  return g_descs.count(p) ? p : nullptr;
}
// The attribute `name` of `d` with `type`, or nullptr.
const Attr* get(const Descriptor& d, int name, cudnnBackendAttributeType_t type) {
  auto it = d.attrs.find(name);
  return it != d.attrs.end() && it->second.type == type ? &it->second : nullptr;
}

// A finalized descriptor of `type` held in attribute `name`, or nullptr.
Descriptor* get_desc(const Descriptor& d, int name, cudnnBackendDescriptorType_t type) {
  void* p = nullptr;
  if (!get_one(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &p)) return nullptr;
  Descriptor* x = desc_of(p);
  return x != nullptr && x->type == type && x->finalized ? x : nullptr;
}

std::string dims_str(const TensorInfo& t) {
  std::string s = "[";
  for (int i = 0; i < t.nd; ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "]";
}
}  // namespace strata::cuda_emu::emu_cudnn

using namespace strata::cuda_emu;             // NOLINT: the C API below is global
using namespace strata::cuda_emu::emu_cudnn;  // NOLINT

extern "C" {

// STRATA_CUDA_EMU_CUDNN_VERSION=N (read at each call) reports release N (e.g. 91500) instead of
// the headers' version, so tests can see Note [cuDNN SDPA limits] send a shape to the own kernel.
// Only the number changes: the emulated graph API stays the same.
size_t cudnnGetVersion(void) {
  if (const char* v = std::getenv("STRATA_CUDA_EMU_CUDNN_VERSION"); v && *v) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end && *end == '\0' && n >= 90000 && n < 100000) return static_cast<size_t>(n);
    std::fprintf(stderr,
                 "STRATA_CUDA_EMU_CUDNN_VERSION=%s is not a cuDNN 9 version number "
                 "(major * 10000 + minor * 100 + patch, e.g. 91500)\n",
                 v);
    std::abort();
  }
  return CUDNN_VERSION;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
    default:
      return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  std::snprintf(message, max_size, "%s", t_last_message.c_str());
  t_last_message.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: null handle");
  *handle = reinterpret_cast<cudnnHandle_t>(new Handle{});
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: null handle");
  if (!valid_stream(stream)) return bad(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: bad stream");
  reinterpret_cast<Handle*>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  if (descriptor == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "null descriptor");
  auto* d = new Descriptor{};
  d->type = type;
  std::lock_guard<std::mutex> lock(g_mu);
  g_descs.insert(d);
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard<std::mutex> lock(g_mu);
  Descriptor* d = desc_of(descriptor);
  if (d == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "destroy: not a descriptor");
  g_descs.erase(d);
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* values) {
  std::lock_guard<std::mutex> lock(g_mu);
  Descriptor* d = desc_of(descriptor);
  if (d == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "set attribute: not a descriptor");
  if (d->finalized) return bad(CUDNN_STATUS_BAD_PARAM, "set attribute: already finalized");
  const size_t eb = attr_bytes(type);
  if (eb == 0 || count < 0 || (count > 0 && values == nullptr))
    return bad(CUDNN_STATUS_BAD_PARAM, "set attribute: bad type, count or values");
  Attr a{type, count, std::vector<char>(static_cast<size_t>(count) * eb)};
  if (count > 0) std::memcpy(a.bytes.data(), values, a.bytes.size());
  d->attrs[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard<std::mutex> lock(g_mu);
  Descriptor* d = desc_of(descriptor);
  if (d == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "finalize: not a descriptor");
  if (d->finalized) return bad(CUDNN_STATUS_BAD_PARAM, "finalize: already finalized");
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      s = finalize_tensor(*d);
      break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
      cudnnDataType_t prec;
      if (!get_one(*d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &d->op.pw) ||
          !get_one(*d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec))
        return bad(CUDNN_STATUS_BAD_PARAM, "pointwise: mode and math precision required");
      get_one(*d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &d->op.axis);
      switch (d->op.pw) {
        case CUDNN_POINTWISE_ADD:
        case CUDNN_POINTWISE_SUB:
        case CUDNN_POINTWISE_MUL:
        case CUDNN_POINTWISE_DIV:
        case CUDNN_POINTWISE_EXP:
        case CUDNN_POINTWISE_LOG:
        case CUDNN_POINTWISE_IDENTITY:
        case CUDNN_POINTWISE_CMP_GE:
        case CUDNN_POINTWISE_BINARY_SELECT:
        case CUDNN_POINTWISE_GEN_INDEX:
          break;
        default:
          return bad(CUDNN_STATUS_NOT_SUPPORTED, "pointwise mode not emulated");
      }
      break;
    }
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
      cudnnDataType_t comp;
      if (!get_one(*d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                   &d->op.red) ||
          !get_one(*d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp))
        return bad(CUDNN_STATUS_BAD_PARAM, "reduction: operator and compute type required");
      if (d->op.red != CUDNN_REDUCE_TENSOR_ADD && d->op.red != CUDNN_REDUCE_TENSOR_MAX)
        return bad(CUDNN_STATUS_NOT_SUPPORTED, "reduction operator not emulated");
      break;
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: {
      cudnnDataType_t comp;
      if (!get_one(*d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp))
        return bad(CUDNN_STATUS_BAD_PARAM, "matmul: compute type required");
      break;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      s = finalize_operation(*d);
      break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      s = finalize_graph(*d);
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      Descriptor* g = get_desc(*d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                               CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
      cudnnBackendHeurMode_t mode;
      if (!g || !get_one(*d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode))
        return bad(CUDNN_STATUS_BAD_PARAM, "engine heuristics: graph and mode required");
      d->graph = g->graph;
      break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      cudnnHandle_t h = nullptr;
      Descriptor* cfg =
          get_desc(*d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      if (!cfg || !cfg->graph ||
          !get_one(*d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h) || !h)
        return bad(CUDNN_STATUS_BAD_PARAM, "execution plan: handle and engine config required");
      d->graph = cfg->graph;
      d->handle = reinterpret_cast<Handle*>(h);
      break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
      const Attr* uids = get(*d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64);
      const Attr* ptrs = get(*d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR);
      if (!uids || !ptrs || uids->count != ptrs->count)
        return bad(CUDNN_STATUS_BAD_PARAM, "variant pack: as many uids as pointers required");
      d->uids.resize(static_cast<size_t>(uids->count));
      d->pointers.resize(static_cast<size_t>(ptrs->count));
      if (uids->count > 0) {
        std::memcpy(d->uids.data(), uids->bytes.data(), uids->bytes.size());
        std::memcpy(d->pointers.data(), ptrs->bytes.data(), ptrs->bytes.size());
      }
      get_one(*d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &d->workspace);
      break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      break;  // filled by the heuristics (cudnnBackendGetAttribute), not by the caller
    default:
      return bad(CUDNN_STATUS_NOT_SUPPORTED, "descriptor type not emulated");
  }
  if (s == CUDNN_STATUS_SUCCESS) d->finalized = true;
  return s;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* values) {
  std::lock_guard<std::mutex> lock(g_mu);
  Descriptor* d = desc_of(descriptor);
  if (d == nullptr || !d->finalized)
    return bad(CUDNN_STATUS_BAD_PARAM, "get attribute: not a finalized descriptor");
  if (count == nullptr) return bad(CUDNN_STATUS_BAD_PARAM, "get attribute: null count");
  switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
      if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) break;
      *count = 1;
      if (requested >= 1) {
        void* p = nullptr;
        std::memcpy(&p, values, sizeof(void*));
        Descriptor* cfg = desc_of(p);
        if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
          return bad(CUDNN_STATUS_BAD_PARAM, "heuristics results: not an engine config");
        cfg->graph = d->graph;
        cfg->finalized = true;
      }
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINECFG_ENGINE: {
      if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR || requested < 1) break;
      void* p = nullptr;
      std::memcpy(&p, values, sizeof(void*));
      Descriptor* e = desc_of(p);
      if (!e || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR)
        return bad(CUDNN_STATUS_BAD_PARAM, "engine of config: not an engine descriptor");
      e->graph = d->graph;
      e->finalized = true;
      *count = 1;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      if (type != CUDNN_TYPE_INT64 || requested < 1) break;
      *static_cast<int64_t*>(values) = 0;
      *count = 1;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
      if (type != CUDNN_TYPE_NUMERICAL_NOTE) break;
      *count = 0;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
      if (type != CUDNN_TYPE_INT64 || requested < 1 || !d->graph) break;
      *static_cast<int64_t*>(values) = d->graph->workspace;
      *count = 1;
      return CUDNN_STATUS_SUCCESS;
    default:
      break;
  }
  return bad(CUDNN_STATUS_NOT_SUPPORTED, "get attribute: not emulated for this descriptor");
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_desc,
                                  cudnnBackendDescriptor_t pack_desc) {
  std::shared_ptr<const Graph> graph;
  std::vector<void*> ptr;
  std::vector<float> scalar;
  cudaStream_t stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Descriptor* plan = desc_of(plan_desc);
    Descriptor* pack = desc_of(pack_desc);
    if (!handle || !plan || !plan->finalized ||
        plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !pack || !pack->finalized ||
        pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
      return bad(CUDNN_STATUS_BAD_PARAM, "execute: handle, finalized plan and pack required");
    graph = plan->graph;
    stream = reinterpret_cast<Handle*>(handle)->stream;
    const Graph& g = *graph;
    ptr.assign(g.tensors.size(), nullptr);
    scalar.assign(g.tensors.size(), 0.f);
    DeviceMemory& mem = DeviceMemory::get();
    std::lock_guard<std::mutex> mem_lock(mem.mutex());
    for (size_t t = 0; t < g.tensors.size(); ++t) {
      const TensorInfo& ti = g.tensors[t];
      if (ti.is_virtual) continue;
      auto it = std::find(pack->uids.begin(), pack->uids.end(), ti.uid);
      if (it == pack->uids.end())
        return bad(CUDNN_STATUS_BAD_PARAM, "execute: the variant pack binds no pointer to tensor " +
                                               std::to_string(ti.uid));
      void* p = pack->pointers[static_cast<size_t>(it - pack->uids.begin())];
      if (p == nullptr)
        return bad(CUDNN_STATUS_BAD_PARAM,
                   "execute: null pointer for tensor " + std::to_string(ti.uid));
      if (ti.by_value) {  // a host value, read now
        scalar[t] = load(p, ti.type, 0);
        continue;
      }
      const size_t bytes = static_cast<size_t>(ti.extent()) * type_bytes(ti.type);
      if (mem.find(p, bytes) == nullptr)
        return bad(CUDNN_STATUS_BAD_PARAM, "execute: tensor " + std::to_string(ti.uid) + " " +
                                               dims_str(ti) + " at " +
                                               std::to_string(reinterpret_cast<uintptr_t>(p)) +
                                               " is not inside one device allocation");
      ptr[t] = p;
    }
    if (g.workspace > 0 && (pack->workspace == nullptr ||
                            mem.find(pack->workspace, static_cast<size_t>(g.workspace)) == nullptr))
      return bad(CUDNN_STATUS_BAD_PARAM, "execute: the workspace is missing or too small");
  }
  enqueue(stream, [graph, ptr, scalar] {
    count_graph_run();
    if (dry_run()) return;  // Note [Emulator dry run]
    DeviceOp op("cudnnBackendExecute");
    Run r{graph.get(), {}, ptr, scalar};
    r.virt.resize(graph->tensors.size());
    for (size_t t = 0; t < graph->tensors.size(); ++t) {
      const TensorInfo& ti = graph->tensors[t];
      if (ti.is_virtual)
        r.virt[t].assign(static_cast<size_t>(ti.extent()), 0.f);
      else if (!ti.by_value)
        open_range(ptr[t], static_cast<size_t>(ti.extent()) * type_bytes(ti.type));
    }
    for (const OpInfo& o : graph->ops) run_op(r, o);
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
