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
#include "cuda_emu/device_memory.h"
#include "cuda_emu/simt.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {
namespace {

thread_local std::string t_last_message;

cudnnStatus_t bad(cudnnStatus_t s, std::string msg) {
  t_last_message = std::move(msg);
  return s;
}

constexpr int kMaxDims = 8;

struct TensorInfo {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int nd = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  bool is_virtual = false;
  bool by_value = false;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < nd; ++i) n *= dims[i];
    return n;
  }
  // One past the largest offset an element reaches.
  int64_t extent() const {
    int64_t e = 1;
    for (int i = 0; i < nd; ++i) e += (dims[i] - 1) * strides[i];
    return e;
  }
  bool same_shape(const TensorInfo& o) const {
    if (nd != o.nd) return false;
    for (int i = 0; i < nd; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
};

size_t type_bytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32:
      return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    case CUDNN_DATA_BOOLEAN:
      return 1;
    default:
      return 0;
  }
}

float load(const void* p, cudnnDataType_t t, int64_t i) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
      return static_cast<const float*>(p)[i];
    case CUDNN_DATA_INT32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case CUDNN_DATA_BFLOAT16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDNN_DATA_HALF:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const uint8_t*>(p)[i] != 0 ? 1.f : 0.f;
  }
}

// v rounded to what type t can hold.
float round_to(cudnnDataType_t t, float v) {
  switch (t) {
    case CUDNN_DATA_BFLOAT16:
      return __bfloat162float(__float2bfloat16_rn(v));
    case CUDNN_DATA_HALF:
      return __half2float(__float2half_rn(v));
    case CUDNN_DATA_INT32:
      return static_cast<float>(static_cast<int32_t>(v));
    case CUDNN_DATA_BOOLEAN:
      return v != 0.f ? 1.f : 0.f;
    default:
      return v;
  }
}

void store(void* p, cudnnDataType_t t, int64_t i, float v) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDNN_DATA_INT32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case CUDNN_DATA_BFLOAT16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case CUDNN_DATA_HALF:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<uint8_t*>(p)[i] = v != 0.f;
      break;
  }
}

enum class OpKind { Pointwise, Reduction, Matmul, Reshape };

struct OpInfo {
  OpKind kind = OpKind::Pointwise;
  cudnnPointwiseMode_t pw = CUDNN_POINTWISE_ADD;
  cudnnReduceTensorOp_t red = CUDNN_REDUCE_TENSOR_ADD;
  int64_t axis = -1;
  // Inputs (x, b, t for pointwise; x for reduction and reshape; a, b for matmul) and output.
  std::vector<int> in;  // indices into Graph::tensors
  int out = -1;
};

// A finalized operation graph: its own copy of every tensor and node, in execution order.
struct Graph {
  std::vector<TensorInfo> tensors;
  std::vector<OpInfo> ops;
  std::vector<int64_t> bound;  // non-virtual uids
  int64_t workspace = 0;
};

struct Attr {
  cudnnBackendAttributeType_t type;
  int64_t count = 0;
  std::vector<char> bytes;
};

struct Handle {
  cudaStream_t stream = nullptr;
};

struct Descriptor {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, Attr> attrs;
  // What finalize derived.
  TensorInfo tensor;                    // TENSOR
  OpInfo op;                            // POINTWISE / REDUCTION / MATMUL descriptors, ops
  std::vector<Descriptor*> op_tensors;  // OPERATION_*: the tensor descriptors, as `op.in`
  std::shared_ptr<const Graph> graph;   // OPERATIONGRAPH, ENGINEHEUR, ENGINECFG, ENGINE, PLAN
  Handle* handle = nullptr;             // OPERATIONGRAPH, PLAN
  std::vector<int64_t> uids;            // VARIANT_PACK
  std::vector<void*> pointers;          // VARIANT_PACK
  void* workspace = nullptr;            // VARIANT_PACK
};

std::mutex g_mu;
std::unordered_set<Descriptor*> g_descs;

Descriptor* desc_of(cudnnBackendDescriptor_t d) {
  auto* p = static_cast<Descriptor*>(d);
  return g_descs.count(p) ? p : nullptr;
}

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

// The attribute `name` of `d` with `type`, or nullptr.
const Attr* get(const Descriptor& d, int name, cudnnBackendAttributeType_t type) {
  auto it = d.attrs.find(name);
  return it != d.attrs.end() && it->second.type == type ? &it->second : nullptr;
}

template <typename T>
bool get_one(const Descriptor& d, int name, cudnnBackendAttributeType_t type, T* out) {
  const Attr* a = get(d, name, type);
  if (a == nullptr || a->count != 1) return false;
  std::memcpy(out, a->bytes.data(), sizeof(T));
  return true;
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

cudnnStatus_t finalize_tensor(Descriptor& d) {
  TensorInfo& t = d.tensor;
  const Attr* dims = get(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64);
  const Attr* strides = get(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64);
  if (!get_one(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &t.type) || !dims ||
      !strides || !get_one(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &t.uid))
    return bad(CUDNN_STATUS_BAD_PARAM,
               "tensor: data type, dimensions, strides and unique id are required");
  int64_t align = 0;
  if (!get_one(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align) || align <= 0)
    return bad(CUDNN_STATUS_BAD_PARAM, "tensor: byte alignment is required");
  if (dims->count != strides->count || dims->count < 1 || dims->count > kMaxDims)
    return bad(CUDNN_STATUS_BAD_PARAM, "tensor: dimensions and strides differ in count");
  if (type_bytes(t.type) == 0) return bad(CUDNN_STATUS_NOT_SUPPORTED, "tensor: data type");
  t.nd = static_cast<int>(dims->count);
  std::memcpy(t.dims, dims->bytes.data(), dims->bytes.size());
  std::memcpy(t.strides, strides->bytes.data(), strides->bytes.size());
  for (int i = 0; i < t.nd; ++i)
    if (t.dims[i] < 1 || t.strides[i] < 0)
      return bad(CUDNN_STATUS_BAD_PARAM, "tensor " + std::to_string(t.uid) + ": dims " +
                                             dims_str(t) + " must be positive, strides >= 0");
  get_one(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &t.is_virtual);
  get_one(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &t.by_value);
  if (t.by_value && t.numel() != 1)
    return bad(CUDNN_STATUS_BAD_PARAM, "tensor: a by-value tensor has one element");
  return CUDNN_STATUS_SUCCESS;
}

bool is_unary(cudnnPointwiseMode_t m) {
  return m == CUDNN_POINTWISE_EXP || m == CUDNN_POINTWISE_LOG || m == CUDNN_POINTWISE_IDENTITY ||
         m == CUDNN_POINTWISE_GEN_INDEX;
}

// Every dim of `in` equals out's or is 1.
bool broadcasts(const TensorInfo& in, const TensorInfo& out) {
  if (in.nd != out.nd) return false;
  for (int i = 0; i < in.nd; ++i)
    if (in.dims[i] != out.dims[i] && in.dims[i] != 1) return false;
  return true;
}

cudnnStatus_t finalize_operation(Descriptor& d) {
  auto tensor_attr = [&](int name) { return get_desc(d, name, CUDNN_BACKEND_TENSOR_DESCRIPTOR); };
  OpInfo& op = d.op;
  d.op_tensors.clear();
  Descriptor* out = nullptr;
  switch (d.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      Descriptor* pw = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      Descriptor* x = tensor_attr(CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
      Descriptor* b = tensor_attr(CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
      Descriptor* t = tensor_attr(CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
      out = tensor_attr(CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
      if (!pw || !x || !out)
        return bad(CUDNN_STATUS_BAD_PARAM, "pointwise operation: descriptor, x and y required");
      op = pw->op;
      op.kind = OpKind::Pointwise;
      const bool unary = is_unary(op.pw);
      const bool select = op.pw == CUDNN_POINTWISE_BINARY_SELECT;
      if (unary != (b == nullptr) || select != (t != nullptr))
        return bad(CUDNN_STATUS_BAD_PARAM, "pointwise operation: wrong inputs for its mode");
      if (op.pw == CUDNN_POINTWISE_GEN_INDEX &&
          (op.axis < 0 || op.axis >= x->tensor.nd || !x->tensor.same_shape(out->tensor)))
        return bad(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX: axis outside x, or x and y differ");
      d.op_tensors = {x};
      if (b) d.op_tensors.push_back(b);
      if (t) d.op_tensors.push_back(t);
      for (Descriptor* in : d.op_tensors)
        if (!broadcasts(in->tensor, out->tensor))
          return bad(CUDNN_STATUS_BAD_PARAM, "pointwise operation: input " + dims_str(in->tensor) +
                                                 " against output " + dims_str(out->tensor));
      break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      Descriptor* r =
          get_desc(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
      Descriptor* x = tensor_attr(CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
      out = tensor_attr(CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
      if (!r || !x || !out)
        return bad(CUDNN_STATUS_BAD_PARAM, "reduction operation: descriptor, x and y required");
      op = r->op;
      op.kind = OpKind::Reduction;
      if (!broadcasts(out->tensor, x->tensor))
        return bad(CUDNN_STATUS_BAD_PARAM, "reduction: output " + dims_str(out->tensor) +
                                               " is not input " + dims_str(x->tensor) +
                                               " with some dims 1");
      d.op_tensors = {x};
      break;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      Descriptor* a = tensor_attr(CUDNN_ATTR_OPERATION_MATMUL_ADESC);
      Descriptor* b = tensor_attr(CUDNN_ATTR_OPERATION_MATMUL_BDESC);
      out = tensor_attr(CUDNN_ATTR_OPERATION_MATMUL_CDESC);
      if (!a || !b || !out ||
          !get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR))
        return bad(CUDNN_STATUS_BAD_PARAM, "matmul operation: a, b, c and descriptor required");
      op.kind = OpKind::Matmul;
      const TensorInfo &ta = a->tensor, &tb = b->tensor, &tc = out->tensor;
      bool ok = ta.nd == tb.nd && ta.nd == tc.nd && ta.nd >= 2;
      for (int i = 0; ok && i < ta.nd - 2; ++i)
        ok = ta.dims[i] == tc.dims[i] && tb.dims[i] == tc.dims[i];
      const int n = ta.nd;
      ok = ok && ta.dims[n - 2] == tc.dims[n - 2] && tb.dims[n - 1] == tc.dims[n - 1] &&
           ta.dims[n - 1] == tb.dims[n - 2];
      if (!ok)
        return bad(CUDNN_STATUS_BAD_PARAM,
                   "matmul: " + dims_str(ta) + " x " + dims_str(tb) + " -> " + dims_str(tc));
      d.op_tensors = {a, b};
      break;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      Descriptor* x = tensor_attr(CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
      out = tensor_attr(CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
      if (!x || !out) return bad(CUDNN_STATUS_BAD_PARAM, "reshape operation: x and y required");
      op.kind = OpKind::Reshape;
      if (x->tensor.numel() != out->tensor.numel() || x->tensor.extent() != out->tensor.extent())
        return bad(CUDNN_STATUS_BAD_PARAM, "reshape: " + dims_str(x->tensor) + " and " +
                                               dims_str(out->tensor) +
                                               " are not views of the same storage");
      d.op_tensors = {x};
      break;
    }
    default:
      return bad(CUDNN_STATUS_NOT_SUPPORTED, "operation type not emulated");
  }
  d.op_tensors.push_back(out);
  return CUDNN_STATUS_SUCCESS;
}

// Orders the nodes so every virtual input is produced first, and collects the tensors.
cudnnStatus_t finalize_graph(Descriptor& d) {
  const Attr* ops = get(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR);
  cudnnHandle_t h = nullptr;
  if (!ops || ops->count < 1 ||
      !get_one(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h))
    return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: handle and operations required");
  d.handle = reinterpret_cast<Handle*>(h);
  auto g = std::make_shared<Graph>();
  std::map<int64_t, int> by_uid;
  std::vector<std::pair<OpInfo, std::vector<int>>> nodes;  // op, tensor indices (inputs, out)
  std::vector<int> producer;
  for (int64_t i = 0; i < ops->count; ++i) {
    void* p = nullptr;
    std::memcpy(&p, ops->bytes.data() + i * sizeof(void*), sizeof(void*));
    Descriptor* op = desc_of(p);
    if (!op || !op->finalized || op->op_tensors.empty())
      return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: an entry is not a finalized operation");
    std::vector<int> idx;
    for (Descriptor* t : op->op_tensors) {
      auto it = by_uid.find(t->tensor.uid);
      if (it == by_uid.end()) {
        it = by_uid.emplace(t->tensor.uid, static_cast<int>(g->tensors.size())).first;
        g->tensors.push_back(t->tensor);
        producer.push_back(-1);
      } else {
        const TensorInfo& known = g->tensors[it->second];
        if (!known.same_shape(t->tensor) || known.type != t->tensor.type ||
            known.is_virtual != t->tensor.is_virtual ||
            !std::equal(known.strides, known.strides + known.nd, t->tensor.strides))
          return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: two tensors with uid " +
                                                 std::to_string(known.uid) + " differ");
      }
      idx.push_back(it->second);
    }
    const int out = idx.back();
    if (producer[out] >= 0)
      return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: tensor " +
                                             std::to_string(g->tensors[out].uid) +
                                             " is written by two operations");
    if (g->tensors[out].by_value)
      return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: an operation writes a by-value tensor");
    producer[out] = static_cast<int>(nodes.size());
    nodes.push_back({op->op, idx});
  }
  for (size_t t = 0; t < g->tensors.size(); ++t) {
    if (g->tensors[t].is_virtual && producer[t] < 0)
      return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual tensor " +
                                             std::to_string(g->tensors[t].uid) +
                                             " is read but never written");
    if (!g->tensors[t].is_virtual) g->bound.push_back(g->tensors[t].uid);
  }
  // Dependency order: a node runs once every virtual input has been written.
  std::vector<bool> done(nodes.size(), false), ready(g->tensors.size(), false);
  for (size_t t = 0; t < g->tensors.size(); ++t) ready[t] = producer[t] < 0;
  for (size_t placed = 0; placed < nodes.size();) {
    bool progress = false;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (done[n]) continue;
      const std::vector<int>& idx = nodes[n].second;
      if (!std::all_of(idx.begin(), idx.end() - 1, [&](int t) { return ready[t]; })) continue;
      OpInfo op = nodes[n].first;
      op.in.assign(idx.begin(), idx.end() - 1);
      op.out = idx.back();
      g->ops.push_back(op);
      ready[op.out] = true;
      done[n] = true;
      ++placed;
      progress = true;
    }
    if (!progress) return bad(CUDNN_STATUS_BAD_PARAM, "operation graph: a cycle");
  }
  for (const OpInfo& op : g->ops)
    if (op.kind == OpKind::Reduction) {
      g->workspace = g->tensors[op.out].numel() * 4;
      break;
    }
  // An attention backward (five matmuls) without an f32 dQ accumulator is what cuDNN serves
  // deterministically by keeping dP in a workspace: 2 bytes per score, rows and columns rounded
  // up to 64 (cudnn-frontend's estimate of that workspace). Asked for here too, so that device
  // memory in emulated (and dry) runs counts it as a GPU would.
  const auto matmuls = std::count_if(g->ops.begin(), g->ops.end(),
                                     [](const OpInfo& op) { return op.kind == OpKind::Matmul; });
  if (matmuls >= 5) {
    const auto first = std::find_if(g->ops.begin(), g->ops.end(),
                                    [](const OpInfo& op) { return op.kind == OpKind::Matmul; });
    const TensorInfo& sc = g->tensors[first->out];
    auto up64 = [](int64_t x) { return (x + 63) / 64 * 64; };
    int64_t batch = 1;
    for (int i = 0; i + 2 < sc.nd; ++i) batch *= sc.dims[i];
    g->workspace += batch * up64(sc.dims[sc.nd - 2]) * up64(sc.dims[sc.nd - 1]) * 2;
  }
  d.graph = g;
  return CUDNN_STATUS_SUCCESS;
}

// ---- execution ----

// Values of one graph run: virtual tensors in f32 storage (by offset), the rest in memory.
struct Run {
  const Graph* g;
  std::vector<std::vector<float>> virt;
  std::vector<void*> ptr;     // non-virtual device pointers
  std::vector<float> scalar;  // by-value inputs

  float read(int t, int64_t off) const {
    const TensorInfo& ti = g->tensors[t];
    if (ti.by_value) return scalar[t];
    if (ti.is_virtual) return virt[t][off];
    return load(ptr[t], ti.type, off);
  }
  void write(int t, int64_t off, float v) {
    const TensorInfo& ti = g->tensors[t];
    if (ti.is_virtual)
      virt[t][off] = round_to(ti.type, v);
    else
      store(ptr[t], ti.type, off, v);
  }
};

// Calls f(offset in t for every coordinate of `shape`, the coordinate) in row-major order;
// dims where t has 1 and `shape` more are broadcast.
template <typename F>
void for_each(const TensorInfo& shape, const F& f) {
  int64_t c[kMaxDims] = {};
  const int64_t n = shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    f(c);
    for (int d = shape.nd - 1; d >= 0; --d) {
      if (++c[d] < shape.dims[d]) break;
      c[d] = 0;
    }
  }
}

int64_t offset(const TensorInfo& t, const int64_t* c) {
  int64_t o = 0;
  for (int d = 0; d < t.nd; ++d) o += (t.dims[d] == 1 ? 0 : c[d]) * t.strides[d];
  return o;
}

float pointwise(cudnnPointwiseMode_t m, float x, float b, float t) {
  switch (m) {
    case CUDNN_POINTWISE_ADD:
      return x + b;
    case CUDNN_POINTWISE_SUB:
      return x - b;
    case CUDNN_POINTWISE_MUL:
      return x * b;
    case CUDNN_POINTWISE_DIV:
      return x / b;
    case CUDNN_POINTWISE_EXP:
      return std::exp(x);
    case CUDNN_POINTWISE_LOG:
      return std::log(x);
    case CUDNN_POINTWISE_CMP_GE:
      return x >= b ? 1.f : 0.f;
    case CUDNN_POINTWISE_BINARY_SELECT:
      return t != 0.f ? x : b;
    default:  // IDENTITY
      return x;
  }
}

void run_op(Run& r, const OpInfo& op) {
  const Graph& g = *r.g;
  const TensorInfo& out = g.tensors[op.out];
  switch (op.kind) {
    case OpKind::Pointwise:
      for_each(out, [&](const int64_t* c) {
        float v;
        if (op.pw == CUDNN_POINTWISE_GEN_INDEX) {
          v = static_cast<float>(c[op.axis]);
        } else {
          const float x = r.read(op.in[0], offset(g.tensors[op.in[0]], c));
          const float b = op.in.size() > 1 ? r.read(op.in[1], offset(g.tensors[op.in[1]], c)) : 0;
          const float t = op.in.size() > 2 ? r.read(op.in[2], offset(g.tensors[op.in[2]], c)) : 0;
          v = pointwise(op.pw, x, b, t);
        }
        r.write(op.out, offset(out, c), v);
      });
      break;
    case OpKind::Reduction: {
      const bool max = op.red == CUDNN_REDUCE_TENSOR_MAX;
      std::vector<float> acc(static_cast<size_t>(out.extent()),
                             max ? -INFINITY : 0.f);  // by output offset
      const TensorInfo& x = g.tensors[op.in[0]];
      for_each(x, [&](const int64_t* c) {
        const float v = r.read(op.in[0], offset(x, c));
        float& a = acc[static_cast<size_t>(offset(out, c))];
        a = max ? std::max(a, v) : a + v;
      });
      for_each(out, [&](const int64_t* c) {
        const int64_t o = offset(out, c);
        r.write(op.out, o, acc[static_cast<size_t>(o)]);
      });
      break;
    }
    case OpKind::Matmul: {
      // Operands gathered into dense f32 rows first (A as [M][K], B transposed as [N][K]), so the
      // inner loop is a plain dot product in k order.
      const TensorInfo &a = g.tensors[op.in[0]], &b = g.tensors[op.in[1]];
      const int n = out.nd;
      const int64_t m = out.dims[n - 2], nn = out.dims[n - 1], kk = a.dims[n - 1];
      TensorInfo batch = out;
      batch.dims[n - 2] = batch.dims[n - 1] = 1;
      std::vector<float> am(static_cast<size_t>(m * kk)), bt(static_cast<size_t>(nn * kk));
      for_each(batch, [&](const int64_t* c0) {
        int64_t c[kMaxDims];
        std::copy(c0, c0 + n, c);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t q = 0; q < kk; ++q) {
            c[n - 2] = i, c[n - 1] = q;
            am[static_cast<size_t>(i * kk + q)] = r.read(op.in[0], offset(a, c));
          }
        for (int64_t q = 0; q < kk; ++q)
          for (int64_t j = 0; j < nn; ++j) {
            c[n - 2] = q, c[n - 1] = j;
            bt[static_cast<size_t>(j * kk + q)] = r.read(op.in[1], offset(b, c));
          }
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nn; ++j) {
            const float* x = am.data() + i * kk;
            const float* y = bt.data() + j * kk;
            float sum = 0.f;
            for (int64_t q = 0; q < kk; ++q) sum += x[q] * y[q];
            c[n - 2] = i, c[n - 1] = j;
            r.write(op.out, offset(out, c), sum);
          }
      });
      break;
    }
    case OpKind::Reshape: {
      // The same storage: element at offset o of y is the element at offset o of x.
      const TensorInfo& x = g.tensors[op.in[0]];
      std::vector<float> storage(static_cast<size_t>(x.extent()), 0.f);
      for_each(x, [&](const int64_t* c) {
        const int64_t o = offset(x, c);
        storage[static_cast<size_t>(o)] = r.read(op.in[0], o);
      });
      for_each(out, [&](const int64_t* c) {
        const int64_t o = offset(out, c);
        r.write(op.out, o, storage[static_cast<size_t>(o)]);
      });
      break;
    }
  }
}

void open_range(const void* p, size_t bytes) {
  DeviceMemory& mem = DeviceMemory::get();
  if (Allocation* a = mem.find(p, bytes)) mem.open(*a);
}

}  // namespace
}  // namespace strata::cuda_emu

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

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
