// The emulated cuDNN's finalize step (Note [Emulated cuDNN] in cudnn.cpp): a tensor's dims and
// strides, an operation's inputs and output, and a graph's nodes put in dependency order.
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
namespace {

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
}  // namespace

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

}  // namespace strata::cuda_emu::emu_cudnn
