// The emulated cuDNN graph API (Note [Emulated cuDNN] in cuda_emu/cudnn.cpp): the nodes it
// runs give what the backend API documents, and graphs or variant packs that do not fit are
// refused with a message.
#include <cudnn_graph.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu/device_vector.h"

namespace strata::cuda_emu {
namespace {

using D = cudnnBackendDescriptor_t;
using Dims = std::vector<int64_t>;

std::string last_error() {
  char msg[512] = {0};
  cudnnGetLastErrorString(msg, sizeof(msg));
  return msg;
}

// Owns every descriptor it makes.
struct Builder {
  ~Builder() {
    for (D d : all) cudnnBackendDestroyDescriptor(d);
  }
  D make(cudnnBackendDescriptorType_t t) {
    D d = nullptr;
    EXPECT_EQ(cudnnBackendCreateDescriptor(t, &d), CUDNN_STATUS_SUCCESS);
    all.push_back(d);
    return d;
  }
  static void set(D d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t c,
                  const void* v) {
    EXPECT_EQ(cudnnBackendSetAttribute(d, n, t, c, v), CUDNN_STATUS_SUCCESS);
  }
  static void set_desc(D d, cudnnBackendAttributeName_t n, D v) {
    set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  D tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
           bool is_virtual = false, bool by_value = false) {
    D t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()),
        dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()),
        strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    int64_t align = 16;
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    EXPECT_EQ(cudnnBackendFinalize(t), CUDNN_STATUS_SUCCESS) << last_error();
    return t;
  }
  void pointwise(cudnnPointwiseMode_t mode, D x, D b, D y) {
    D pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    EXPECT_EQ(cudnnBackendFinalize(pw), CUDNN_STATUS_SUCCESS);
    D op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    EXPECT_EQ(cudnnBackendFinalize(op), CUDNN_STATUS_SUCCESS) << last_error();
    ops.push_back(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, D x, D y) {
    D r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    EXPECT_EQ(cudnnBackendFinalize(r), CUDNN_STATUS_SUCCESS);
    D op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    EXPECT_EQ(cudnnBackendFinalize(op), CUDNN_STATUS_SUCCESS) << last_error();
    ops.push_back(op);
  }
  // Returns the status of finalizing the operation (a bad shape fails here).
  cudnnStatus_t matmul(D a, D b, D c) {
    D m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    EXPECT_EQ(cudnnBackendFinalize(m), CUDNN_STATUS_SUCCESS);
    D op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
    const cudnnStatus_t s = cudnnBackendFinalize(op);
    if (s == CUDNN_STATUS_SUCCESS) ops.push_back(op);
    return s;
  }
  void reshape(D x, D y) {
    D op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    EXPECT_EQ(cudnnBackendFinalize(op), CUDNN_STATUS_SUCCESS) << last_error();
    ops.push_back(op);
  }
  // Graph, heuristics, the first config's plan; returns the plan.
  D plan(cudnnHandle_t h, int64_t* workspace) {
    D g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops.size()), ops.data());
    EXPECT_EQ(cudnnBackendFinalize(g), CUDNN_STATUS_SUCCESS) << last_error();
    D heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    EXPECT_EQ(cudnnBackendFinalize(heur), CUDNN_STATUS_SUCCESS);
    D cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t n = 0;
    EXPECT_EQ(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(n, 1);
    D p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set_desc(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    EXPECT_EQ(cudnnBackendFinalize(p), CUDNN_STATUS_SUCCESS) << last_error();
    EXPECT_EQ(cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, workspace),
              CUDNN_STATUS_SUCCESS);
    return p;
  }
  cudnnStatus_t execute(cudnnHandle_t h, D plan, std::vector<int64_t> uids, std::vector<void*> ptrs,
                        void* workspace) {
    D pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
        static_cast<int64_t>(uids.size()), uids.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
        static_cast<int64_t>(ptrs.size()), ptrs.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    EXPECT_EQ(cudnnBackendFinalize(pack), CUDNN_STATUS_SUCCESS);
    return cudnnBackendExecute(h, plan, pack);
  }
  std::vector<D> all, ops;
};

cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    EXPECT_EQ(cudnnCreate(&x), CUDNN_STATUS_SUCCESS);
    return x;
  }();
  return h;
}

// out[b, i, j] = sum_k x[b, i, k] * w[b, j, k] * s, with w given as its transpose view
// [b, k, j], and rowsum[b, i] = sum_j exp(out[b, i, j]) reduced from a reshaped copy.
TEST(CudaEmuCudnn, AGraphOfMatmulPointwiseReductionAndReshapeRuns) {
  const int64_t B = 2, M = 3, N = 4, K = 5;
  std::vector<float> x(B * M * K), w(B * N * K);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  DeviceVector<float> dx(x), dw(w), dout(B * M * N), dsum(B * M);
  Builder g;
  D tx = g.tensor(1, CUDNN_DATA_FLOAT, {B, M, K}, {M * K, K, 1});
  D twt = g.tensor(2, CUDNN_DATA_FLOAT, {B, K, N}, {N * K, 1, K});  // w [B, N, K] transposed
  D ts = g.tensor(3, CUDNN_DATA_FLOAT, {1, 1, 1}, {1, 1, 1}, false, true);
  D tout = g.tensor(4, CUDNN_DATA_FLOAT, {B, M, N}, {M * N, N, 1});
  D tsum = g.tensor(5, CUDNN_DATA_FLOAT, {B, M, 1}, {M, 1, 1});
  D prod = g.tensor(100, CUDNN_DATA_FLOAT, {B, M, N}, {M * N, N, 1}, true);
  ASSERT_EQ(g.matmul(tx, twt, prod), CUDNN_STATUS_SUCCESS) << last_error();
  g.pointwise(CUDNN_POINTWISE_MUL, prod, ts, tout);
  D e = g.tensor(101, CUDNN_DATA_FLOAT, {B, M, N}, {M * N, N, 1}, true);
  g.pointwise(CUDNN_POINTWISE_EXP, tout, nullptr, e);
  D et = g.tensor(102, CUDNN_DATA_FLOAT, {B, N, M}, {M * N, 1, N}, true);  // e seen transposed
  g.reshape(e, et);
  D back = g.tensor(103, CUDNN_DATA_FLOAT, {B, M, N}, {M * N, N, 1}, true);
  g.reshape(et, back);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, back, tsum);
  int64_t ws = -1;
  D plan = g.plan(handle(), &ws);
  EXPECT_EQ(ws, B * M * 4);
  DeviceVector<char> workspace(static_cast<size_t>(ws));
  float s = 0.5f;
  ASSERT_EQ(g.execute(handle(), plan, {1, 2, 3, 4, 5},
                      {dx.get(), dw.get(), &s, dout.get(), dsum.get()}, workspace.get()),
            CUDNN_STATUS_SUCCESS)
      << last_error();
  s = 7.f;  // read at the call: changing it now changes nothing
  const std::vector<float> out = dout.host(), sum = dsum.host();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < M; ++i) {
      double row = 0;
      for (int64_t j = 0; j < N; ++j) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k) want += x[(b * M + i) * K + k] * w[(b * N + j) * K + k];
        want *= 0.5;
        EXPECT_NEAR(out[(b * M + i) * N + j], want, 1e-6);
        row += std::exp(want);
      }
      EXPECT_NEAR(sum[b * M + i], row, 1e-5);
    }
}

TEST(CudaEmuCudnn, MismatchedShapesAndMissingBindingsAreRefusedWithAMessage) {
  Builder g;
  D a = g.tensor(1, CUDNN_DATA_FLOAT, {1, 2, 3}, {6, 3, 1});
  D b = g.tensor(2, CUDNN_DATA_FLOAT, {1, 4, 5}, {20, 5, 1});
  D c = g.tensor(3, CUDNN_DATA_FLOAT, {1, 2, 5}, {10, 5, 1});
  EXPECT_EQ(g.matmul(a, b, c), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(last_error().find("matmul"), std::string::npos);

  Builder h;
  D x = h.tensor(1, CUDNN_DATA_FLOAT, {1, 1, 8}, {8, 8, 1});
  D y = h.tensor(2, CUDNN_DATA_FLOAT, {1, 1, 8}, {8, 8, 1});
  h.pointwise(CUDNN_POINTWISE_EXP, x, nullptr, y);
  int64_t ws = -1;
  D plan = h.plan(handle(), &ws);
  EXPECT_EQ(ws, 0);
  DeviceVector<float> dx(8, 0.f), small(4, 0.f);
  EXPECT_EQ(h.execute(handle(), plan, {1}, {dx.get()}, nullptr), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(last_error().find("binds no pointer to tensor 2"), std::string::npos);
  EXPECT_EQ(h.execute(handle(), plan, {1, 2}, {dx.get(), small.get()}, nullptr),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(last_error().find("not inside one device allocation"), std::string::npos);
}

}  // namespace
}  // namespace strata::cuda_emu
