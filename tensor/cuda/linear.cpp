// The CUDA backend's linear with bias/GELU epilogues and its backward pieces: one cuBLASLt GEMM
// each (matmul.h), or a plain GEMM and the kernels of linear.cu.
//
// Note [CUDA linear epilogues]
// linear and its backward pieces (Note [Linear epilogues] in tensor/ops.h) run one GEMM each with
// a cuBLASLt epilogue, in the mapping of Note [CUDA matmul] (D = out^T, column-major, D's rows
// are out's columns):
//   y = act(x W^T + b)        a = x, b = W^T: BIAS, GELU_BIAS, or GELU_AUX_BIAS when the GELU
//                             input is kept: the bias vector has D's row count (out's columns),
//                             and AUX (pre) has D's layout, leading dimension N.
//   dW = dy^T x, db = sum dy  a = dy^T, b = x: BGRADB reduces cuBLAS's B (= dy, transposed) over
//                             the GEMM's k (the rows), giving one value per column of D (of dy).
//   dpre = (dz W) * gelu'(pre), db = sum dpre
//                             a = dz, b = W: DGELU_BGRAD reads AUX (pre, leading dimension N)
//                             and writes the bias gradient over D's columns (the rows of dpre).
// The epilogue works on the f32 accumulator and rounds once, which is the op's contract. AUX and
// the bias (gradient) take the output's dtype (cuBLASLt's default). NVIDIA's documentation calls
// the epilogue just "GELU"; PyTorch's _addmm_activation relies on it being the tanh form, and
// tests/cuda/fused_ops_test.cpp holds it to the CPU's tanh GELU, which would catch an erf one.
// The backward GELU is the exception: on the H100 DGELU_BGRAD did not keep that contract (its
// f32 dpre and bias gradient strayed from the CPU's by TF32-sized amounts, as an approximate GELU
// derivative would, though the GEMM itself is full f32; its bf16 bias gradient by several ulps,
// as if summed from the rounded dpre; docs/perf/2026-11-26-h100.md). So linear_backward_gelu runs
// a plain GEMM and Note [Linear GELU gradient kernel] unless STRATA_LINEAR_DGELU=epilogue asks
// for the epilogue in bf16/f16 (for measurements: tools/gpu_session.sh dgelu times both; f32
// never takes it). cuBLASLt requires AUX's leading dimension to be a multiple of 8, and may have
// no algorithm for an epilogue at some shape or alignment: then (once logged per epilogue) the
// GEMM writes its f32 product and the kernels of linear.cu finish with the same one-rounding
// semantics.
// STRATA_LINEAR_EPILOGUE=off (unset, empty or auto: on) forces that fallback everywhere, for
// tests and comparisons.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <map>
#include <mutex>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

namespace {

// STRATA_LINEAR_EPILOGUE: false when set to off (Note [CUDA linear epilogues]).
bool epilogues_enabled() {
  return env_choice("STRATA_LINEAR_EPILOGUE",
                    {{"auto", "cuBLASLt's bias/GELU epilogues where they run"},
                     {"off", "plain GEMMs and separate kernels"}}) == 0;
}

// STRATA_LINEAR_DGELU: whether linear_backward_gelu runs cuBLASLt's DGELU(_BGRAD) epilogue
// (Note [CUDA linear epilogues]).
bool dgelu_epilogue() {
  return env_choice(
             "STRATA_LINEAR_DGELU",
             {{"kernels", "a plain GEMM, then Strata's GELU-gradient and bias-gradient pass"},
              {"epilogue", "cuBLASLt's DGELU_BGRAD epilogue (not the op's rounding)"}}) == 1;
}

// Logs once per epilogue kind that it fell back to the unfused kernels.
void note_fallback(cublasLtEpilogue_t e, const char* op, int64_t m, int64_t n, int64_t k) {
  static std::mutex mu;
  static std::map<int, bool> logged;
  std::lock_guard<std::mutex> lock(mu);
  if (logged[static_cast<int>(e)]) return;
  logged[static_cast<int>(e)] = true;
  log::warn(
      "cuBLASLt runs no {} epilogue for {} (m={} n={} k={}, or STRATA_LINEAR_EPILOGUE=off): using "
      "a plain GEMM and separate kernels with the same rounding (logged once)",
      epilogue_name(e), op, m, n, k);
}

void check_linear_dtypes(const char* op, std::initializer_list<const Tensor*> ts) {
  const DType t = (*ts.begin())->dtype();
  for (const Tensor* x : ts)
    STRATA_CHECK(!x->defined() || x->dtype() == t,
                 "CUDA {}: {} is not {} (Note [Low-precision ops])", op, x->str(), dtype_name(t));
  STRATA_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16, "CUDA {}: dtype {}", op,
               dtype_name(t));
}

Tensor f32_scratch(int64_t rows, int64_t cols, Device device) {
  offload::CategoryScope scope(offload::Category::Workspace);
  return Tensor::empty({rows, cols}, DType::F32, device);
}

void check_kernel(bool enqueued, const char* what) {
  STRATA_CHECK(enqueued, "CUDA {}: no kernel for these dtypes", what);
  check_cuda(cudaGetLastError(), what);
}

}  // namespace

void CudaBackend::linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 Activation act, Tensor& y, Tensor& pre) {
  OpScope prof(stream_, "linear_forward",
               2.0 * static_cast<double>(y.numel()) * static_cast<double>(x.size(-1)),
               bytes_of({&x, &weight, &bias, &y, &pre}));
  check_linear_dtypes("linear_forward", {&y, &x, &weight, &bias, &pre});
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  if (y.numel() == 0) return;
  const bool gelu = act == Activation::Gelu;
  if (!gelu && !bias.defined()) return matmul(x, weight, y, false, true, 1.f, 0.f);
  Epilogue e;
  e.bias = bias.defined() ? bias.data_ptr() : nullptr;
  if (!gelu) {
    e.kind = CUBLASLT_EPILOGUE_BIAS;
  } else if (pre.defined()) {
    e.kind = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    e.aux = pre.data_ptr();
    e.aux_ld = n;
  } else {
    e.kind = bias.defined() ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  const bool fits = k > 0 && (e.aux == nullptr || n % 8 == 0);
  if (fits && epilogues_enabled() &&
      run_gemm(lt_, matmul_workspace_, stream_, x, weight, y, false, true, 1.f, 0.f, e))
    return;
  note_fallback(e.kind, "linear", m, n, k);
  // The f32 product (y itself when y is f32), then bias and activation with one rounding.
  Tensor acc = y.dtype() == DType::F32 ? y : f32_scratch(m, n, device());
  matmul(x, weight, acc, false, true, 1.f, 0.f);
  check_kernel(
      launch_bias_act(static_cast<int>(y.dtype()), acc.data<float>(), e.bias, gelu ? 1 : 0,
                      y.data_ptr(), pre.defined() ? pre.data_ptr() : nullptr, m, n, stream_),
      "linear bias/activation");
}

void CudaBackend::linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                         Tensor& dbias, bool accumulate) {
  OpScope prof(stream_, "linear_backward_weight",
               2.0 * static_cast<double>(dweight.numel()) * static_cast<double>(dy.size(0)),
               bytes_of({&dy, &x, &dweight, &dbias}));
  check_linear_dtypes("linear_backward_weight", {&dweight, &dy, &x, &dbias});
  const int64_t rows = dy.size(0), n = dy.size(1), k = x.size(1);
  // accumulate: beta = 1, C = D = dweight (Note [Weight gradients into their buffer]).
  const float beta = accumulate ? 1.f : 0.f;
  if (!dbias.defined()) return matmul(dy, x, dweight, true, false, 1.f, beta);
  Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_BGRADB;
  e.bias = dbias.data_ptr();
  if (dweight.numel() > 0 && rows > 0 && epilogues_enabled() &&
      run_gemm(lt_, matmul_workspace_, stream_, dy, x, dweight, true, false, 1.f, beta, e))
    return;
  if (dweight.numel() > 0 && rows > 0) note_fallback(e.kind, "linear weight gradient", n, k, rows);
  matmul(dy, x, dweight, true, false, 1.f, beta);
  const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(std::max<int64_t>(chunks, 1) * n * 4);
  check_kernel(launch_column_sums(static_cast<int>(dy.dtype()), dy.data_ptr(),
                                  static_cast<int>(dbias.dtype()), dbias.data_ptr(),
                                  static_cast<float*>(s.data_ptr()), rows, n, stream_),
               "linear bias gradient");
}

void CudaBackend::linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                       Tensor& dpre, Tensor& dbias) {
  OpScope prof(stream_, "linear_backward_gelu",
               2.0 * static_cast<double>(dpre.numel()) * static_cast<double>(dz.size(1)),
               bytes_of({&dz, &weight, &pre, &dpre, &dbias}));
  check_linear_dtypes("linear_backward_gelu", {&dpre, &dz, &weight, &pre, &dbias});
  const int64_t rows = dz.size(0), p = dz.size(1), n = weight.size(1);
  if (dpre.numel() == 0 && !dbias.defined()) return;
  Epilogue e;
  e.kind = dbias.defined() ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  e.bias = dbias.defined() ? dbias.data_ptr() : nullptr;
  e.aux = pre.data_ptr();
  e.aux_ld = n;
  const bool fits = rows > 0 && n > 0 && p > 0 && n % 8 == 0;
  // f32 keeps its own rounding whatever the switch says: run.tf32 off means f32 everywhere.
  const bool want_epilogue = epilogues_enabled() && dpre.dtype() != DType::F32 && dgelu_epilogue();
  if (fits && want_epilogue &&
      run_gemm(lt_, matmul_workspace_, stream_, dz, weight, dpre, false, false, 1.f, 0.f, e))
    return;
  if (rows > 0 && n > 0 && want_epilogue) note_fallback(e.kind, "linear GELU gradient", rows, n, p);
  // Note [Linear GELU gradient kernel]: the f32 product, then one pass for dpre and dbias.
  Tensor dh2 = f32_scratch(rows, n, device());
  matmul(dz, weight, dh2, false, false, 1.f, 0.f);
  const int dt = static_cast<int>(dpre.dtype());
  if (!dbias.defined()) {
    check_kernel(launch_gelu_backward_f32(dt, dh2.data<float>(), pre.data_ptr(), dpre.data_ptr(),
                                          rows, n, stream_),
                 "linear GELU gradient");
    return;
  }
  const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(std::max<int64_t>(chunks, 1) * n * 4);
  check_kernel(launch_gelu_backward_bias(dt, dh2.data<float>(), pre.data_ptr(), dpre.data_ptr(),
                                         dbias.data_ptr(), static_cast<float*>(s.data_ptr()), rows,
                                         n, stream_),
               "linear GELU and bias gradient");
}

}  // namespace strata::tensor::cuda
