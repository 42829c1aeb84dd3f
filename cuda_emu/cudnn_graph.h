#pragma once
// The emulated cuDNN's internals (Note [Emulated cuDNN] in cudnn.cpp), shared by cudnn.cpp (the
// descriptors and the C API), cudnn_finalize.cpp (finalizing tensors, operations and graphs) and
// cudnn_exec.cpp (running a finalized graph).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata::cuda_emu::emu_cudnn {

inline constexpr int kMaxDims = 8;

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

inline size_t type_bytes(cudnnDataType_t t) {
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

inline float load(const void* p, cudnnDataType_t t, int64_t i) {
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
inline float round_to(cudnnDataType_t t, float v) {
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

inline void store(void* p, cudnnDataType_t t, int64_t i, float v) {
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

// Records `msg` for cudnnGetLastErrorString and returns s.
cudnnStatus_t bad(cudnnStatus_t s, std::string msg);

// The live descriptor d, or nullptr.
Descriptor* desc_of(cudnnBackendDescriptor_t d);

// The attribute `name` of `d` with `type`, or nullptr.
const Attr* get(const Descriptor& d, int name, cudnnBackendAttributeType_t type);

template <typename T>
bool get_one(const Descriptor& d, int name, cudnnBackendAttributeType_t type, T* out) {
  const Attr* a = get(d, name, type);
  if (a == nullptr || a->count != 1) return false;
  std::memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}

// A finalized descriptor of `type` held in attribute `name`, or nullptr.
Descriptor* get_desc(const Descriptor& d, int name, cudnnBackendDescriptorType_t type);

std::string dims_str(const TensorInfo& t);

// Finalizing a descriptor (cudnn_finalize.cpp): its attributes checked and what they mean derived.
cudnnStatus_t finalize_tensor(Descriptor& d);
cudnnStatus_t finalize_operation(Descriptor& d);
cudnnStatus_t finalize_graph(Descriptor& d);

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

// Runs node `op` of r's graph (cudnn_exec.cpp).
void run_op(Run& r, const OpInfo& op);

// Marks the device allocation holding [p, p + bytes) as used by this run (cudnn_exec.cpp).
void open_range(const void* p, size_t bytes);

}  // namespace strata::cuda_emu::emu_cudnn
