// CUDA matmul through cuBLASLt.
//
// Note [CUDA matmul]
// Strata's tensors are row-major and cuBLASLt is column-major: a row-major [r, c] matrix is the
// column-major [c, r] one, so out = op(a) @ op(b) is computed as out^T = op(b)^T @ op(a)^T with
// b passed as cuBLAS's A and a as its B, transposes unchanged. Batches are strided; a 2-D b is
// shared by giving it batch stride 0. f32 inputs use CUBLAS_COMPUTE_32F (no TF32), bf16/f16
// inputs accumulate in f32 (CUBLAS_COMPUTE_32F, f32 alpha/beta) and write C/D in their own dtype
// (the op layer's default, Note [Low-precision ops]) or in f32 (matmul_out into an F32 out); with
// beta != 0, C is read in that same dtype. The algorithm
// is chosen once per problem (cached) and never one whose split-K reduction is done in place
// with atomics, so the same problem gives the same bits every run (Note [Backend contract]).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "tensor/cuda/cuda_backend.h"

namespace strata::tensor::cuda {

namespace {

constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    detail::throw_check_failure(__FILE__, __LINE__, what,
                                fmt::format("cuBLASLt status {}", static_cast<int>(s)));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      STRATA_UNREACHABLE("matmul dtype {}", dtype_name(t));
  }
}

// Descriptors freed at scope exit.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
         int64_t stride) {
    check_lt(cublasLtMatrixLayoutCreate(&h, type, static_cast<uint64_t>(rows),
                                        static_cast<uint64_t>(cols), ld),
             "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      int32_t b = static_cast<int32_t>(batch);
      check_lt(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)),
          "batch count");
      check_lt(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)),
               "batch stride");
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

using Key =
    std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int, int, bool, bool, uint32_t>;

// Largest power of two (at most 256) dividing the address: cuBLASLt assumes 256-byte aligned
// operands unless told otherwise, and views (narrow, select) start anywhere.
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                         float alpha, float beta) {
  const DType in = a.dtype();
  const bool ok =
      (in == DType::F32 && out.dtype() == DType::F32) ||
      ((in == DType::BF16 || in == DType::F16) && (out.dtype() == DType::F32 || out.dtype() == in));
  STRATA_CHECK(ok && b.dtype() == in, "CUDA matmul dtypes {} @ {} -> {}", a.str(), b.str(),
               out.str());
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = out.numel() / std::max<int64_t>(m * n, 1);
  if (out.numel() == 0) return;
  if (k == 0) {  // empty sum: out = beta * out
    if (beta == 0.f) return fill(out, 0.0);
    Tensor tmp = out.clone();
    return affine(tmp, beta, 0.f, out);
  }
  const bool b_batched = b.ndim() > 2;
  if (!matmul_workspace_.defined()) {
    offload::CategoryScope ws(offload::Category::Workspace);
    matmul_workspace_ = Tensor::empty({kWorkspaceBytes}, DType::U8, device());
  }

  // Note [CUDA matmul]: cuBLAS A = b, cuBLAS B = a, C = out^T.
  Layout la(cuda_type(in), trans_b ? k : n, trans_b ? n : k, trans_b ? k : n, batch,
            b_batched ? k * n : 0);
  Layout lb(cuda_type(in), trans_a ? m : k, trans_a ? k : m, trans_a ? m : k, batch, m * k);
  Layout lc(cuda_type(out.dtype()), n, m, n, batch, m * n);

  cublasLtMatmulDesc_t op;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
           "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
           "TRANSB");

  static std::mutex mu;
  static std::map<Key, cublasLtMatmulAlgo_t> algos;
  const uint32_t align = std::min(
      {alignment_of(a.data_ptr()), alignment_of(b.data_ptr()), alignment_of(out.data_ptr())});
  const Key key{m,
                n,
                k,
                batch,
                trans_a,
                trans_b,
                static_cast<int>(in),
                static_cast<int>(out.dtype()),
                b_batched,
                beta != 0.f,
                align};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = algos.find(key);
    if (it == algos.end()) {
      cublasLtMatmulPreference_t pref;
      check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
      uint64_t ws = static_cast<uint64_t>(kWorkspaceBytes);
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)),
               "workspace pref");
      for (auto attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)),
                 "alignment pref");
      // Deterministic reductions only (Note [CUDA matmul]).
      uint32_t mask = CUBLASLT_REDUCTION_SCHEME_MASK & ~CUBLASLT_REDUCTION_SCHEME_INPLACE;
      check_lt(cublasLtMatmulPreferenceSetAttribute(
                   pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)),
               "reduction pref");
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t s =
          cublasLtMatmulAlgoGetHeuristic(lt_, op, la.h, lb.h, lc.h, lc.h, pref, 1, &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        cublasLtMatmulDescDestroy(op);
        STRATA_CHECK(false, "cuBLASLt has no algorithm for {}{} @ {}{} -> {}", a.str(),
                     trans_a ? "^T" : "", b.str(), trans_b ? "^T" : "", out.str());
      }
      it = algos.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  const cublasStatus_t s =
      cublasLtMatmul(lt_, op, &alpha, b.data_ptr(), la.h, a.data_ptr(), lb.h, &beta, out.data_ptr(),
                     lc.h, out.data_ptr(), lc.h, &algo, matmul_workspace_.data_ptr(),
                     static_cast<size_t>(kWorkspaceBytes), stream_);
  cublasLtMatmulDescDestroy(op);
  check_lt(s, "cublasLtMatmul");
}

}  // namespace strata::tensor::cuda
