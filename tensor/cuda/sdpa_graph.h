#pragma once
// The cuDNN backend API as sdpa_plan.cpp and sdpa_graph.cpp use it (built with cuDNN only): the
// entry points resolved from the loaded library, owned descriptors, and the operation graphs of
// fused attention (sdpa_graph.cpp builds them; Note [cuDNN SDPA] in cudnn_sdpa.cpp says why they
// look as they do).
#include <cudnn_graph.h>

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "tensor/cuda/sdpa_plan.h"

namespace strata::tensor::cuda {

// The entry points Strata uses, resolved from the loaded library.
struct Api {
  decltype(&::cudnnGetVersion) get_version = nullptr;
  decltype(&::cudnnCreate) create = nullptr;
  decltype(&::cudnnSetStream) set_stream = nullptr;
  decltype(&::cudnnGetErrorString) error_string = nullptr;
  decltype(&::cudnnGetLastErrorString) last_error = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&::cudnnBackendSetAttribute) set_attr = nullptr;
  decltype(&::cudnnBackendGetAttribute) get_attr = nullptr;
  decltype(&::cudnnBackendFinalize) finalize = nullptr;
  decltype(&::cudnnBackendExecute) execute = nullptr;
};

// The loaded library's entry points (sdpa_plan.cpp); set before any descriptor is made.
extern const Api* g_api;

// Raised on a failed cuDNN call (sdpa_plan.cpp, sdpa_graph.cpp); build_sdpa_plan / execute turn it
// into false.
struct CudnnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws CudnnError naming `what` and cuDNN's message unless s is success.
void ck(cudnnStatus_t s, const char* what);

// An owned backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    ck(g_api->create_desc(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_) g_api->destroy_desc(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
           const void* values) {
    ck(g_api->set_attr(d_, name, type, n, values), "cudnnBackendSetAttribute");
  }
  void set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  void set_i64(cudnnBackendAttributeName_t name, int64_t v) { set(name, CUDNN_TYPE_INT64, 1, &v); }
  void set_type(cudnnBackendAttributeName_t name, cudnnDataType_t t) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &t);
  }
  void finalize(const char* what) { ck(g_api->finalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Graph tensor ids: the non-virtual ones are bound per call (SdpaPlanImpl::execute).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kSkv,
  kSq,
  kDO,
  kDQ,
  kDK,
  kDV,
  kOne,
  kRowSum,
  kFirstVirtual = 100
};

using Dims = std::array<int64_t, 4>;

inline Dims packed(const Dims& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// Collects the descriptors of one operation graph (kept alive with the plan).
class GraphBuilder {
 public:
  using D = cudnnBackendDescriptor_t;

  D tensor(int64_t uid, cudnnDataType_t type, const Dims& dim, const Dims& stride,
           bool is_virtual = false, bool by_value = false) {
    Desc& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride.data());
    t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
    t.set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    bool v = is_virtual;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) {
      bool b = true;
      t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b);
    }
    t.finalize("tensor descriptor");
    if (!is_virtual) bound.push_back(uid);
    return t.get();
  }
  D virt(cudnnDataType_t type, const Dims& dim) { return virt(type, dim, packed(dim)); }
  D virt(cudnnDataType_t type, const Dims& dim, const Dims& stride) {
    return tensor(next_uid_++, type, dim, stride, true);
  }
  // A [1, 1, 1, 1] value passed from the host in the variant pack.
  D scalar(int64_t uid, cudnnDataType_t type) {
    return tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]); `prec` is the compute type, `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, D x, D b, D y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 D t = nullptr, int64_t axis = -1) {
    Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize("pointwise descriptor");
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.finalize("pointwise operation");
    ops_.push_back(op.get());
  }
  void reduction(cudnnReduceTensorOp_t mode, D x, D y) {
    Desc& r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    r.set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    r.finalize("reduction descriptor");
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get());
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.finalize("reduction operation");
    ops_.push_back(op.get());
  }
  // c = a @ b over the last two dims, batched over the first two; f32 accumulation.
  void matmul(D a, D b, D c) {
    Desc& m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    m.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    m.finalize("matmul descriptor");
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m.get());
    op.finalize("matmul operation");
    ops_.push_back(op.get());
  }
  // y is x seen through other dims/strides (used as a transpose).
  void reshape(D x, D y) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize("reshape operation");
    ops_.push_back(op.get());
  }

  // `h` null: a graph for a deviceless plan (Note [Deviceless cuDNN plans]).
  Desc& finalize_graph(cudnnHandle_t h) {
    Desc& g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (h) g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          static_cast<int64_t>(ops_.size()), ops_.data());
    g.finalize("operation graph");
    return g;
  }

  std::vector<std::unique_ptr<Desc>> keep;
  std::vector<int64_t> bound;  // non-virtual uids, bound in the variant pack

 private:
  Desc& make(cudnnBackendDescriptorType_t type) {
    keep.push_back(std::make_unique<Desc>(type));
    return *keep.back();
  }
  std::vector<D> ops_;
  int64_t next_uid_ = kFirstVirtual;
};

using D = GraphBuilder::D;

// The forward and backward graphs of fused attention for one problem (Note [cuDNN SDPA]).
void build_forward(GraphBuilder& g, const SdpaKey& k);
void build_backward(GraphBuilder& g, const SdpaKey& k);

}  // namespace strata::tensor::cuda
