// CUDA matmul through cuBLASLt and the GEMM that linear.cpp shares (matmul.h); the choice of
// its algorithm per problem is in matmul_tuning.cpp.
//
// Note [CUDA matmul]
// Strata's tensors are row-major and cuBLASLt is column-major: a row-major [r, c] matrix is the
// column-major [c, r] one, so out = op(a) @ op(b) is computed as out^T = op(b)^T @ op(a)^T with
// b passed as cuBLAS's A and a as its B, transposes unchanged. Batches are strided; a 2-D b is
// shared by giving it batch stride 0, except that a contiguous stack of untransposed a's (the
// LM head's [B, T, C] @ W^T and its input gradient) is one GEMM over all B*T rows, as PyTorch's
// matmul folds it: one large problem for the heuristic instead of B strided ones. f32 inputs use
// CUBLAS_COMPUTE_32F (no TF32), or CUBLAS_COMPUTE_32F_FAST_TF32 while tensor::set_cuda_tf32 is on
// (Note [TF32] in tensor/cuda.h); bf16/f16 inputs accumulate in f32 (CUBLAS_COMPUTE_32F, f32
// alpha/beta) and write C/D in their own dtype (the op layer's default, Note [Low-precision ops])
// or in f32 (matmul_out into an F32 out); with beta != 0, C is read in that same dtype. The
// algorithm is chosen once per problem (cached) and sums split-K slices only in f32 (Note
// [Split-K reductions]), so the same problem gives the same bits every run (Note [Backend
// contract]) and a 16-bit output is rounded once. Two problems (another shape, transpose,
// epilogue or alignment) may get other algorithms, and so other summation orders and other
// last bits: callers that need two paths to agree bitwise give them the same problem.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/matmul_tuning.h"
#include "tensor/cuda/profiler.h"
#include "tensor/cuda/split_k.h"

namespace strata::tensor::cuda {

namespace {

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

// Note [TF32]: whether f32 GEMMs may round their inputs to TF32 (tensor::set_cuda_tf32).
std::atomic<bool> g_tf32{false};

// Largest power of two (at most 256) dividing the address: cuBLASLt assumes 256-byte aligned
// operands unless told otherwise, and views (narrow, select) start anywhere.
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

void ensure_workspace(Tensor& ws, Device device) {
  if (ws.defined()) return;
  offload::CategoryScope scope(offload::Category::Workspace);
  ws = Tensor::empty({kWorkspaceBytes}, DType::U8, device);
}

}  // namespace

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "DEFAULT";
  }
}

// out = alpha * op(a) @ op(b) + beta * out with epilogue `epi` on `stream` (Note [CUDA matmul]).
// Shapes and dtypes are the caller's to check; k > 0. Returns false, having enqueued nothing, when
// cuBLASLt has no algorithm for the problem or refuses it.
bool run_gemm(cublasLtHandle_t lt, Tensor& workspace, cudaStream_t stream, const Tensor& a,
              const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha, float beta,
              const Epilogue& epi) {
  const DType in = a.dtype();
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = out.numel() / std::max<int64_t>(m * n, 1);
  const bool b_batched = b.ndim() > 2;
  ensure_workspace(workspace, out.device());

  // Note [CUDA matmul]: cuBLAS A = b, cuBLAS B = a, C = out^T.
  Layout la(cuda_type(in), trans_b ? k : n, trans_b ? n : k, trans_b ? k : n, batch,
            b_batched ? k * n : 0);
  Layout lb(cuda_type(in), trans_a ? m : k, trans_a ? k : m, trans_a ? m : k, batch, m * k);
  Layout lc(cuda_type(out.dtype()), n, m, n, batch, m * n);

  // Note [TF32]: f32 inputs may run on the tensor cores, each rounded to TF32 first.
  const bool tf32 = in == DType::F32 && g_tf32.load(std::memory_order_relaxed);
  cublasLtMatmulDesc_t op;
  check_lt(cublasLtMatmulDescCreate(&op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                    CUDA_R_32F),
           "MatmulDescCreate");
  struct DescGuard {
    cublasLtMatmulDesc_t d;
    ~DescGuard() { cublasLtMatmulDescDestroy(d); }
  } guard{op};
  cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
           "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
           "TRANSB");
  uint32_t align = std::min(
      {alignment_of(a.data_ptr()), alignment_of(b.data_ptr()), alignment_of(out.data_ptr())});
  if (epi.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi.kind,
                                            sizeof(epi.kind)),
             "EPILOGUE");
    // The heuristic reads these pointers' alignment, so they are set before it runs.
    if (epi.bias) {
      check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias,
                                              sizeof(epi.bias)),
               "BIAS_POINTER");
      align = std::min(align, alignment_of(epi.bias));
    }
    if (epi.aux) {
      check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &epi.aux, sizeof(epi.aux)),
               "AUX_POINTER");
      check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &epi.aux_ld,
                                              sizeof(epi.aux_ld)),
               "AUX_LD");
      align = std::min(align, alignment_of(epi.aux));
    }
  }

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
                align,
                static_cast<int>(epi.kind),
                epi.aux_ld,
                epi.bias ? alignment_of(epi.bias) : 0u,
                epi.aux ? alignment_of(epi.aux) : 0u,
                tf32};
  cublasLtMatmulAlgo_t algo;
  {
    Tuning& t = tuning();
    std::lock_guard<std::mutex> lock(t.mu);
    configure_from_env(t);
    // Paused (CudaMatmulTuningPause): a problem not tuned yet takes the heuristic's first, kept
    // apart so that it is still tuned when met unpaused.
    const bool tuning_now = t.on && t.paused == 0;
    auto& algos = t.on && !tuning_now ? t.untuned : t.algos;
    const std::optional<cublasLtMatmulAlgo_t>* known = nullptr;
    if (auto i = t.algos.find(key); i != t.algos.end()) {
      known = &i->second;
    } else if (auto j = algos.find(key); j != algos.end()) {
      known = &j->second;
    }
    if (known == nullptr) {
      cublasLtMatmulPreference_t pref;
      check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
      struct PrefGuard {
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
      } pref_guard{pref};
      uint64_t ws = static_cast<uint64_t>(kWorkspaceBytes);
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)),
               "workspace pref");
      for (auto attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)),
                 "alignment pref");
      // Note [Split-K reductions].
      uint32_t mask = kReductionSchemes;
      check_lt(cublasLtMatmulPreferenceSetAttribute(
                   pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)),
               "reduction pref");
      std::optional<cublasLtMatmulAlgo_t> chosen;
      if (tuning_now) {
        const GemmCall call{lt,
                            op,
                            la.h,
                            lb.h,
                            lc.h,
                            a.data_ptr(),
                            b.data_ptr(),
                            out.data_ptr(),
                            static_cast<size_t>(batch * m * n) * dtype_size(out.dtype()),
                            alpha,
                            beta,
                            workspace.data_ptr(),
                            stream};
        chosen = tune(t, key, call, pref, out.device());
      } else {
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, op, la.h, lb.h, lc.h, lc.h,
                                                                 pref, 1, &result, &found);
        if (st == CUBLAS_STATUS_SUCCESS && found > 0) chosen = result.algo;
      }
      known = &algos.emplace(key, chosen).first->second;
    }
    if (!*known) return false;
    algo = **known;
  }
  const cublasStatus_t st =
      cublasLtMatmul(lt, op, &alpha, b.data_ptr(), la.h, a.data_ptr(), lb.h, &beta, out.data_ptr(),
                     lc.h, out.data_ptr(), lc.h, &algo, workspace.data_ptr(),
                     static_cast<size_t>(kWorkspaceBytes), stream);
  // An epilogue cuBLASLt accepted in the heuristic but refuses to run falls back like a missing
  // one; a plain GEMM that fails is an error.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && epi.kind != CUBLASLT_EPILOGUE_DEFAULT) return false;
  check_lt(st, "cublasLtMatmul");
  return true;
}

void CudaBackend::matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                         float alpha, float beta) {
  OpScope prof(stream_, "matmul",
               2.0 * static_cast<double>(out.numel()) *
                   static_cast<double>(trans_a ? a.size(-2) : a.size(-1)),
               bytes_of({&a, &b, &out}));
  const DType in = a.dtype();
  const bool ok =
      (in == DType::F32 && out.dtype() == DType::F32) ||
      ((in == DType::BF16 || in == DType::F16) && (out.dtype() == DType::F32 || out.dtype() == in));
  STRATA_CHECK(ok && b.dtype() == in, "CUDA matmul dtypes {} @ {} -> {}", a.str(), b.str(),
               out.str());
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  if (out.numel() == 0) return;
  if (k == 0) {  // empty sum: out = beta * out
    if (beta == 0.f) return fill(out, 0.0);
    Tensor tmp = out.clone();
    return affine(tmp, beta, 0.f, out);
  }
  // Note [CUDA matmul]: a stack of a's over one shared b is one GEMM of all their rows.
  if (b.ndim() == 2 && a.ndim() > 2 && !trans_a && a.is_contiguous() && out.is_contiguous()) {
    const Tensor rows = a.view({a.numel() / a.size(-1), a.size(-1)});
    Tensor out_rows = out.view({out.numel() / out.size(-1), out.size(-1)});
    STRATA_CHECK(run_gemm(lt_, matmul_workspace_, stream_, rows, b, out_rows, false, trans_b, alpha,
                          beta, Epilogue{}),
                 "cuBLASLt has no algorithm for {} @ {}{} -> {}", rows.str(), b.str(),
                 trans_b ? "^T" : "", out_rows.str());
    return;
  }
  STRATA_CHECK(run_gemm(lt_, matmul_workspace_, stream_, a, b, out, trans_a, trans_b, alpha, beta,
                        Epilogue{}),
               "cuBLASLt has no algorithm for {}{} @ {}{} -> {}", a.str(), trans_a ? "^T" : "",
               b.str(), trans_b ? "^T" : "", out.str());
}

void set_tf32(bool on) {
  g_tf32.store(on, std::memory_order_relaxed);
}

bool tf32() {
  return g_tf32.load(std::memory_order_relaxed);
}

}  // namespace strata::tensor::cuda
