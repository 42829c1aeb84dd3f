// cuDNN backend-API plumbing for fused attention: loading libcudnn (dlopen), descriptors, the
// forward and backward operation graphs, engine choice and execution. The graphs and why they
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

namespace strata::tensor::cuda {

namespace {

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

const Api* g_api = nullptr;
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

// Raised inside this file on a failed cuDNN call; build_sdpa_plan / execute turn it into false.
struct CudnnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ck(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  g_api->last_error(detail, sizeof(detail));
  throw CudnnError(
      fmt::format("{}: {}{}{}", what, g_api->error_string(s), detail[0] ? ": " : "", detail));
}

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

cudnnHandle_t handle_for(int device) {
  static cudnnHandle_t h = nullptr;  // one process per GPU (DESIGN.md decision 10)
  if (!h) {
    if (cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      throw CudnnError(fmt::format("cudaSetDevice({}) failed", device));
    }
    ck(g_api->create(&h), "cudnnCreate");
  }
  return h;
}

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

Dims packed(const Dims& d) {
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

// s with -inf where key j > query i + (Tk - Tq) (Note [cuDNN SDPA], masking).
D causal_mask(GraphBuilder& g, D s, const SdpaKey& k) {
  const Dims sd = {k.b, k.h, k.tq, k.tk};
  D row = g.virt(CUDNN_DATA_INT32, sd);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, CUDNN_DATA_INT32, nullptr, 2);
  D col = g.virt(CUDNN_DATA_INT32, sd);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, CUDNN_DATA_INT32, nullptr, 3);
  if (k.tq != k.tk) {  // bottom-right alignment: row + Tk - Tq
    D plus = g.virt(CUDNN_DATA_INT32, sd);
    g.pointwise(CUDNN_POINTWISE_ADD, row, g.scalar(kSkv, CUDNN_DATA_INT32), plus, CUDNN_DATA_INT32);
    D shifted = g.virt(CUDNN_DATA_INT32, sd);
    g.pointwise(CUDNN_POINTWISE_SUB, plus, g.scalar(kSq, CUDNN_DATA_INT32), shifted,
                CUDNN_DATA_INT32);
    row = shifted;
  }
  D keep = g.virt(CUDNN_DATA_BOOLEAN, sd);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  D out = g.virt(CUDNN_DATA_FLOAT, sd);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, g.scalar(kNegInf, CUDNN_DATA_FLOAT), out,
              CUDNN_DATA_FLOAT, keep);
  return out;
}

cudnnDataType_t io_type(const SdpaKey& k) {
  return k.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The strides of operand `op` as the key holds them (Note [Strided attention operands]).
Dims strides_of(const SdpaKey& k, SdpaOperand op) {
  const auto& s = k.strides[op];
  return {s[0], s[1], s[2], 1};
}

// A [B, H, T, D] operand in its own layout.
D operand(GraphBuilder& g, int64_t uid, const SdpaKey& k, SdpaOperand op) {
  const int64_t t = op == kSdpaK || op == kSdpaV || op == kSdpaDK || op == kSdpaDV ? k.tk : k.tq;
  return g.tensor(uid, io_type(k), {k.b, k.h, t, k.d}, strides_of(k, op));
}

// K (or V) [B, H, Tk, D] described as its transpose [B, H, D, Tk] (the same memory).
D transposed(GraphBuilder& g, int64_t uid, const SdpaKey& k, SdpaOperand op) {
  const Dims s = strides_of(k, op);
  return g.tensor(uid, io_type(k), {k.b, k.h, k.d, k.tk}, {s[0], s[1], 1, s[2]});
}

void build_forward(GraphBuilder& g, const SdpaKey& k) {
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  const Dims sd = {k.b, k.h, k.tq, k.tk}, rd = {k.b, k.h, k.tq, 1};
  D q = operand(g, kQ, k, kSdpaQ);
  D kt = transposed(g, kK, k, kSdpaK);
  D v = operand(g, kV, k, kSdpaV);
  D o = operand(g, kO, k, kSdpaO);
  D stats = g.tensor(kStats, f32, rd, packed(rd));
  D scale = g.scalar(kScale, f32);

  D s = g.virt(f32, sd);
  g.matmul(q, kt, s);
  D scaled = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  if (k.causal) scaled = causal_mask(g, scaled, k);
  // Softmax with Stats = max + log(sum exp(s - max)), as cudnn-frontend's composite softmax.
  D max = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  D centred = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, centred);
  D e = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, e);
  D sum = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  D log_sum = g.virt(f32, rd);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  D p = g.virt(io, sd);  // the second matmul takes P in the io type
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, p);
  g.matmul(p, v, o);
}

void build_backward(GraphBuilder& g, const SdpaKey& k) {
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  const Dims qd = {k.b, k.h, k.tq, k.d}, kd = {k.b, k.h, k.tk, k.d};
  const Dims sd = {k.b, k.h, k.tq, k.tk}, rd = {k.b, k.h, k.tq, 1};
  const Dims td = {k.b, k.h, k.tk, k.tq}, ts = {k.h * k.tq * k.tk, k.tq * k.tk, 1, k.tk};
  D q = operand(g, kQ, k, kSdpaQ);
  D kt = transposed(g, kK, k, kSdpaK);
  D vt = transposed(g, kV, k, kSdpaV);
  D o = operand(g, kO, k, kSdpaO);
  D stats = g.tensor(kStats, f32, rd, packed(rd));
  D dout = operand(g, kDO, k, kSdpaDO);
  D dq = operand(g, kDQ, k, kSdpaDQ);
  D dk = operand(g, kDK, k, kSdpaDK);
  D dv = operand(g, kDV, k, kSdpaDV);
  D scale = g.scalar(kScale, f32);

  // Row sums D = sum(dO * O), kept in the caller's workspace (kRowSum).
  D prod = g.virt(f32, qd);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, prod);
  D red = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, red);
  D row_sum = g.tensor(kRowSum, f32, rd, packed(rd));
  g.pointwise(CUDNN_POINTWISE_MUL, red, g.scalar(kOne, f32), row_sum);  // the dropout slot, 1

  // P = exp(Q K^T * scale - Stats), masked.
  D s = g.virt(f32, sd);
  g.matmul(q, kt, s);
  D scaled = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  D centred = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, centred);
  if (k.causal) centred = causal_mask(g, centred, k);
  D p = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, p);

  // dV = P^T dO
  D pt = g.virt(io, td, ts);
  g.reshape(p, pt);
  g.matmul(pt, dout, dv);

  // dS = P * (dO V^T - D) * scale
  D dp = g.virt(f32, sd);
  g.matmul(dout, vt, dp);
  D diff = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, row_sum, diff);
  D dsp = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, diff, p, dsp);
  D ds = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, dsp, scale, ds);

  // dK = dS^T Q
  D dst = g.virt(io, td, ts);
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);

  // dQ = dS K straight into dQ: no f32 atomic accumulator, so the engine takes its
  // deterministic path (Note [cuDNN SDPA], determinism).
  D k_rows = g.virt(f32, kd, strides_of(k, kSdpaK));  // K's own layout, as kt's
  g.reshape(kt, k_rows);
  g.matmul(ds, k_rows, dq);
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
