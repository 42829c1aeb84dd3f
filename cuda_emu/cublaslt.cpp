// cuBLASLt for the emulated device (Note [Emulated cuBLASLt]).
//
// Note [Emulated cuBLASLt]
// The real library's column-major semantics: with op(X) = X or X^T per TRANSA/TRANSB,
//   D = alpha * op(A) op(B) + beta * C            (C is not read when beta == 0)
// for every batch (BATCH_COUNT, STRIDED_BATCH_OFFSET in elements; a stride of 0 reuses the
// matrix), then the epilogue. A, B are F32, BF16 or F16 (the same type); C and D share a type,
// A's or F32 (F32 only for F32 inputs); compute CUBLAS_COMPUTE_32F(_PEDANTIC), scale type F32,
// host alpha/beta. Each D element is one f32 sum over k in order, alpha/beta/epilogue in f32,
// rounded once (to nearest even) to D's type. CUBLAS_COMPUTE_32F_FAST_TF32 takes F32 A, B, C and
// D only, and first rounds each element of A and B to TF32 (10 fraction bits, to nearest with
// ties away from zero: PTX's cvt.rna.tf32.f32, what CUTLASS converts with; the library may
// instead let the tensor cores drop the low bits, which Strata's tests allow for, Note [TF32] in
// tensor/cuda.h); the sums are f32 as above. Whether the bias-gradient epilogues BGRADA/BGRADB
// sum A or B before or after that rounding is not documented, so with FAST_TF32 they are not
// supported; an algorithm keeps its compute type, and one chosen for the other is refused.
// Epilogues, as cublasLt.h documents them:
//   BIAS            D = x + bias[row]                      (bias: D's type or F32; rows of D)
//   GELU(_BIAS)     D = gelu(x (+ bias))
//   GELU_AUX(_BIAS) the same, and aux[row, col] = the GELU input, in D's type
//   DGELU           D = x * gelu'(aux[row, col])            (aux: the forward's GELU input)
//   DGELU_BGRAD     the same, and bias[row] = sum over columns of that D (before rounding)
//   BGRADA          bias[row] = sum over k of op(A)[row, k]  (length: rows of D)
//   BGRADB          bias[col] = sum over k of op(B)[k, col]  (length: columns of D)
// where x = alpha * op(A) op(B) + beta * C. GELU is the tanh approximation,
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): PyTorch's addmm falls back to
// gelu(approximate="tanh") exactly where it cannot use this epilogue (aten/src/ATen/native/cuda/
// Blas.cpp), and Strata's own GELU kernel is the same function, so fused and unfused agree.
// The aux matrix has AUX_LD (>= rows, a multiple of 8) and AUX_BATCH_STRIDE. Where the real
// library's behaviour is not documented well enough to emulate with confidence - bias-gradient
// epilogues with alpha != 1 or a batch, DGELU with beta != 0, RELU epilogues, row-major or
// tiled orders, device pointer modes, fp8 scaling - the emulator returns
// CUBLAS_STATUS_NOT_SUPPORTED rather than a guess.
// The heuristic returns up to kEmuAlgorithms algorithms (no workspace) that remember the
// preference's minimum alignments; cublasLtMatmul with a less aligned pointer than the algorithm
// was chosen for returns CUBLAS_STATUS_NOT_SUPPORTED, as an algorithm chosen for aligned data
// cannot run on unaligned data. As a real library's do, the algorithms sum k in different orders,
// so they can differ in the last bits: variant 0 in order, 1 from the last k to the first, 2 each
// half on its own and then the two added in f32 (a split-K of 2, reduction scheme COMPUTE_TYPE),
// 3 the same split-K with each half rounded to D's type before they are added (OUTPUT_TYPE:
// offered only for a 16-bit D when the preference's reduction mask allows it and its workspace
// could hold the halves). Which comes first depends on the problem, as the real heuristic's
// choice does (Note [Emulated heuristic]). Their speed is the same unless
// STRATA_CUDA_EMU_CUBLASLT_FASTEST=i names one (by its rank in the heuristic's list): then every
// other algorithm takes 2 ms more of the emulated device's time, for tests of code that times
// them (Note [cuBLASLt tuning]). cublasLtMatmulAlgoCheck accepts an algorithm the heuristic
// returned for the same types; cublasLtMatmulAlgoConfigGetAttribute reports a variant's split
// and reduction scheme.
//
// Note [Emulated heuristic]
// What the H100 run showed (docs/perf/2026-11-26-h100.md) and the emulator models:
//   - The first algorithm depends on the problem and the workspace. A small output (m n batch at
//     most kEmuSmallOutput, one tile's worth or two of a real GPU) with k >= kEmuSplitMinK and a
//     workspace is split over k: variant 3 where the preference allows OUTPUT_TYPE for a 16-bit
//     D, else variant 2; every other problem takes variant 0 first. Code that expects two
//     problems (another shape, transpose or epilogue) to give the same bits, or a 16-bit output
//     to be rounded once whatever the heuristic picks, fails here as it did there.
//   - DGELU and DGELU_BGRAD evaluate gelu' with an approximate tanh: its value rounded to 10
//     fraction bits (relative error at most 2^-11, the precision of PTX's tanh.approx.f32), and
//     DGELU_BGRAD sums D's values after rounding them to D's type. Both are undocumented; they
//     are the smallest model that gives the H100's f32 and bf16 deviations from the op's
//     one-rounding contract. The forward GELU epilogues stayed within f32's tolerance there and
//     are exact here. An operand outside device memory (or past the end of its allocation) aborts,
// as a kernel reading there would fault.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/cublaslt_types.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/simt.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {

namespace {

constexpr uint32_t kHandleMagic = 0x4c744864;  // "LtHd"
constexpr uint64_t kAlgoMagic = 0x5354524154414c47ull;
constexpr int kEmuAlgorithms = 4;
constexpr int64_t kEmuSmallOutput = 128 * 128;  // Note [Emulated heuristic]
constexpr int64_t kEmuSplitMinK = 16;

// STRATA_CUDA_EMU_CUBLASLT_FASTEST: the one algorithm not slowed down, or -1 (Note [Emulated
// cuBLASLt]). Read at every call, so a test can set it in-process.
int fastest_algorithm() {
  const char* v = std::getenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST");
  return v && *v ? std::atoi(v) : -1;
}

struct Handle {
  uint32_t magic = kHandleMagic;
};

bool float_type(uint32_t t) {
  return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

size_t type_bytes(uint32_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

float load(const void* p, uint32_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
}

void store(void* p, uint32_t t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

float gelu(float v) {
  return 0.5f * v * (1.0f + std::tanh(kGeluScale * (v + kGeluCube * v * v * v)));
}

float round_tf32(float v);

// gelu' as DGELU evaluates it (Note [Emulated heuristic]): tanh to 10 fraction bits.
float gelu_grad_approx(float v) {
  const float t = round_tf32(std::tanh(kGeluScale * (v + kGeluCube * v * v * v)));
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

// v rounded to type t and back.
float rounded_to(float v, uint32_t t) {
  switch (t) {
    case CUDA_R_16BF:
      return __bfloat162float(__float2bfloat16_rn(v));
    case CUDA_R_16F:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}

enum EpilogueBits : uint32_t {
  kBias = 1,
  kGelu = 2,
  kAuxOut = 4,
  kDGelu = 8,
  kBgradD = 16,
  kBgradA = 32,
  kBgradB = 64,
};

// The epilogues of Note [Emulated cuBLASLt] as bits; 0 for one that is not supported.
uint32_t epilogue_bits(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return 128;  // nothing to do, but supported
    case CUBLASLT_EPILOGUE_BIAS:
      return kBias;
    case CUBLASLT_EPILOGUE_GELU:
      return kGelu;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return kGelu | kBias;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return kGelu | kAuxOut;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return kGelu | kAuxOut | kBias;
    case CUBLASLT_EPILOGUE_DGELU:
      return kDGelu;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return kDGelu | kBgradD;
    case CUBLASLT_EPILOGUE_BGRADA:
      return kBgradA;
    case CUBLASLT_EPILOGUE_BGRADB:
      return kBgradB;
    default:
      return 0;
  }
}

// A checked problem.
struct Problem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool tf32 = false;  // CUBLAS_COMPUTE_32F_FAST_TF32: A and B rounded to TF32
  uint32_t ta = CUDA_R_32F, tc = CUDA_R_32F;
  uint32_t bits = 0;
  uint32_t bias_type = CUDA_R_32F, aux_type = CUDA_R_32F;
};

cublasStatus_t check(const Desc* d, const Layout* a, const Layout* b, const Layout* c,
                     const Layout* dd, Problem* p) {
  if (d == nullptr || a == nullptr || b == nullptr || c == nullptr || dd == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
      d->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  p->tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (d->scale != CUDA_R_32F || d->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((d->transa != CUBLAS_OP_N && d->transa != CUBLAS_OP_T) ||
      (d->transb != CUBLAS_OP_N && d->transb != CUBLAS_OP_T) || d->transc != CUBLAS_OP_N ||
      d->fill_mode != CUBLAS_FILL_MODE_FULL)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (void* q : d->unsupported_pointer)
    if (q != nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int32_t s : d->scale_mode)
    if (s != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->fast_accum != 0 || d->emulation != nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const Layout* l : {a, b, c, dd}) {
    if (l->order != CUBLASLT_ORDER_COL || l->plane_offset != 0 || l->batch_mode != 0)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!float_type(l->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1 || l->batch < 1 || l->stride < 0)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a->type != b->type || c->type != dd->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (dd->type != a->type && dd->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p->tf32 && (a->type != CUDA_R_32F || dd->type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = d->transa == CUBLAS_OP_T, tb = d->transb == CUBLAS_OP_T;
  p->m = static_cast<int64_t>(ta ? a->cols : a->rows);
  p->k = static_cast<int64_t>(ta ? a->rows : a->cols);
  const int64_t kb = static_cast<int64_t>(tb ? b->cols : b->rows);
  p->n = static_cast<int64_t>(tb ? b->rows : b->cols);
  if (kb != p->k || static_cast<int64_t>(dd->rows) != p->m ||
      static_cast<int64_t>(dd->cols) != p->n || c->rows != dd->rows || c->cols != dd->cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch)
    return CUBLAS_STATUS_INVALID_VALUE;
  p->batch = dd->batch;
  p->ta = a->type;
  p->tc = dd->type;
  p->bits = epilogue_bits(d->epilogue);
  if (p->bits == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool uses_bias = p->bits & (kBias | kBgradD | kBgradA | kBgradB);
  if (uses_bias) {
    if (d->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    p->bias_type = d->bias_type == -1 ? dd->type : static_cast<uint32_t>(d->bias_type);
    if (p->bias_type != dd->type && p->bias_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if ((p->bits & (kBgradD | kBgradA | kBgradB)) && p->batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p->tf32 && (p->bits & (kBgradA | kBgradB))) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p->bits & (kAuxOut | kDGelu)) {
    if (d->aux == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->aux_ld < p->m || d->aux_ld % 8 != 0 || d->aux_batch_stride % 8 != 0)
      return CUBLAS_STATUS_INVALID_VALUE;
    p->aux_type = d->aux_type == -1 ? dd->type : static_cast<uint32_t>(d->aux_type);
    if (p->aux_type != dd->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// v rounded to TF32: 10 fraction bits, to nearest with ties away from zero (cvt.rna.tf32.f32).
// Inf and NaN pass through; a value whose rounding overflows the exponent becomes inf, as there.
float round_tf32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  if ((u & 0x7f800000u) != 0x7f800000u) {
    u += 0x1000u;  // half of the lowest kept bit (bit 13): ties go away from zero
    u &= 0xffffe000u;
  }
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// The algorithm's record of its problem's types and compute (Note [Emulated cuBLASLt]).
bool algo_matches(const cublasLtMatmulAlgo_t& algo, const Problem& p) {
  return algo.data[0] == kAlgoMagic && algo.data[5] == (p.ta | (uint64_t{p.tc} << 32)) &&
         algo.data[6] < static_cast<uint64_t>(kEmuAlgorithms) &&
         (algo.data[7] & ~uint64_t{0xff00}) == (p.tf32 ? 1u : 0u);
}

uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

[[noreturn]] void fail(const char* fmt, const void* p, size_t bytes) {
  std::fprintf(stderr, "strata CUDA emulator: cublasLtMatmul: ");
  std::fprintf(stderr, fmt, p, bytes);
  std::fprintf(stderr, "\n");
  std::abort();
}

// Opens the allocation holding [p, p + bytes) for the matmul, or aborts as a kernel touching
// memory outside device memory would fault.
void open_operand(const char* name, const void* p, size_t bytes) {
  DeviceMemory& mem = DeviceMemory::get();
  if (mem.is_pinned(p, bytes)) return;
  Allocation* a = mem.find(p, bytes);
  if (a == nullptr) {
    char fmt[160];
    std::snprintf(fmt, sizeof(fmt),
                  "%s: [%%p, +%%zu bytes) is not inside one device allocation (a kernel reading "
                  "it would fault)",
                  name);
    fail(fmt, p, bytes);
  }
  mem.open(*a);
}

// Bytes a column-major matrix spans: the last element of the last batch, plus one.
size_t extent(const Layout& l, size_t elem) {
  if (l.rows == 0 || l.cols == 0) return 0;
  const uint64_t last = (l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows +
                        static_cast<uint64_t>(l.batch - 1) * static_cast<uint64_t>(l.stride);
  return static_cast<size_t>(last) * elem;
}

}  // namespace

}  // namespace strata::cuda_emu

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

namespace {

Handle* handle_of(cublasLtHandle_t h) {
  auto* p = reinterpret_cast<Handle*>(h);
  return p != nullptr && p->magic == kHandleMagic ? p : nullptr;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = reinterpret_cast<cublasLtHandle_t>(new Handle());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  Handle* h = handle_of(handle);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the heuristic ----

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (handle_of(handle) == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested < 1 || results == nullptr || returned == nullptr || preference == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  Problem p;
  const cublasStatus_t s =
      check(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(d), &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const Pref* pref = pref_of(preference);
  // Note [Emulated heuristic]: the variants offered, the first one chosen for this problem.
  const int64_t halves_bytes = 2 * p.m * p.n * p.batch * static_cast<int64_t>(type_bytes(p.tc));
  const bool workspace = pref->max_workspace >= static_cast<uint64_t>(halves_bytes);
  const bool output_type = workspace && p.tc != CUDA_R_32F &&
                           (pref->reduction_mask & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE) != 0;
  const bool compute_type = (pref->reduction_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) != 0;
  std::vector<int> variants{0, 1};
  if (compute_type) variants.push_back(2);
  if (output_type) variants.push_back(3);
  if (workspace && p.m * p.n * p.batch <= kEmuSmallOutput && p.k >= kEmuSplitMinK &&
      variants.size() > 2)
    std::rotate(variants.begin(), variants.end() - 1, variants.end());  // the split first
  // The algorithm keeps what it was chosen for (Note [Emulated cuBLASLt]).
  const int n = std::min<int>(requested, static_cast<int>(variants.size()));
  for (int v = 0; v < n; ++v) {
    cublasLtMatmulHeuristicResult_t r{};
    r.algo.data[0] = kAlgoMagic;
    for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = pref->align[i];
    r.algo.data[5] = p.ta | (uint64_t{p.tc} << 32);
    r.algo.data[6] = static_cast<uint64_t>(variants[static_cast<size_t>(v)]);  // summation order
    r.algo.data[7] = (p.tf32 ? 1u : 0u) | (static_cast<uint64_t>(v) << 8);     // tf32, rank
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.f;
    results[v] = r;
  }
  *returned = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  if (handle_of(handle) == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (algo == nullptr || result == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  const cublasStatus_t s =
      check(desc_of(desc), layout_of(a), layout_of(b), layout_of(c), layout_of(d), &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (!algo_matches(*algo, p)) return CUBLAS_STATUS_INVALID_VALUE;
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = *algo;
  result->workspaceSize = 0;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.f;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, size_t n, size_t* written) {
  if (algo == nullptr || algo->data[0] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
  const uint64_t variant = algo->data[6];
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: {
      const uint32_t splits = variant >= 2 ? 2 : 1;
      return get_attr(splits, buf, n, written);
    }
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: {
      const uint32_t scheme = variant == 3   ? CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
                              : variant == 2 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                             : CUBLASLT_REDUCTION_SCHEME_NONE;
      return get_attr(scheme, buf, n, written);
    }
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

size_t cublasLtGetVersion() {
  return CUBLAS_VERSION;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha_p, const void* A, cublasLtMatrixLayout_t adesc,
                              const void* B, cublasLtMatrixLayout_t bdesc, const void* beta_p,
                              const void* C, cublasLtMatrixLayout_t cdesc, void* D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  if (handle_of(handle) == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha_p == nullptr || beta_p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!strata::cuda_emu::valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  const Desc* dsc = desc_of(desc);
  const Layout *la = layout_of(adesc), *lb = layout_of(bdesc), *lc = layout_of(cdesc),
               *ld = layout_of(ddesc);
  Problem p;
  const cublasStatus_t s = check(dsc, la, lb, lc, ld, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const float alpha = *static_cast<const float*>(alpha_p);
  const float beta = *static_cast<const float*>(beta_p);
  if ((p.bits & (kBgradD | kBgradA | kBgradB)) && alpha != 1.f) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((p.bits & kDGelu) && beta != 0.f) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != nullptr) {
    if (!algo_matches(*algo, p))
      return CUBLAS_STATUS_INVALID_VALUE;  // not from the heuristic, or for other types
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; ++i)
      if (alignment_of(ptrs[i]) < algo->data[1 + i]) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const int64_t m = p.m, n = p.n, k = p.k;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;

  // Everything the matmul reads from the descriptors is copied now: the call is enqueued on
  // `stream` (Note [Emulated streams]) and the caller may change or destroy them meanwhile.
  const int variant = algo != nullptr ? static_cast<int>(algo->data[6]) : 0;
  const int rank = algo != nullptr ? static_cast<int>((algo->data[7] >> 8) & 0xff) : 0;
  const int fastest = fastest_algorithm();
  auto run = [dv = *dsc, av = *la, bv = *lb, cv = *lc, dd = *ld, p, m, n, k, alpha, beta, A, B, C,
              D, variant, rank, fastest] {
    const Desc* dsc = &dv;
    const Layout *la = &av, *lb = &bv, *lc = &cv, *ld = &dd;
    count_matmul();
    if (fastest >= 0 && rank != fastest) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (strata::cuda_emu::dry_run()) return;  // Note [Emulator dry run]
    DeviceOp op("cublasLtMatmul");
    const size_t ea = type_bytes(p.ta), ec = type_bytes(p.tc);
    if (k > 0) {
      open_operand("A", A, extent(*la, ea));
      open_operand("B", B, extent(*lb, ea));
    }
    if (beta != 0.f) open_operand("C", C, extent(*lc, ec));
    open_operand("D", D, extent(*ld, ec));
    if (p.bits & (kBias | kBgradD)) {
      const int64_t stride = (p.bits & kBias) ? dsc->bias_batch_stride : 0;
      open_operand("bias", dsc->bias,
                   static_cast<size_t>(m + (p.batch - 1) * stride) * type_bytes(p.bias_type));
    }
    if (p.bits & kBgradA)
      open_operand("bias", dsc->bias, static_cast<size_t>(m) * type_bytes(p.bias_type));
    if (p.bits & kBgradB)
      open_operand("bias", dsc->bias, static_cast<size_t>(n) * type_bytes(p.bias_type));
    if (p.bits & (kAuxOut | kDGelu)) {
      const size_t last =
          static_cast<size_t>((n - 1) * dsc->aux_ld + m + (p.batch - 1) * dsc->aux_batch_stride);
      open_operand("aux", dsc->aux, last * type_bytes(p.aux_type));
    }

    const bool ta = dsc->transa == CUBLAS_OP_T, tb = dsc->transb == CUBLAS_OP_T;
    std::vector<float> ap(static_cast<size_t>(m * k)), bp(static_cast<size_t>(k * n));
    std::vector<float> acc(static_cast<size_t>(n)), acc2(static_cast<size_t>(n)),
        bias_acc(static_cast<size_t>(m));
    for (int64_t bt = 0; bt < p.batch; ++bt) {
      const int64_t oa = bt * la->stride, ob = bt * lb->stride, oc = bt * lc->stride,
                    od = bt * ld->stride;
      // op(A) as f32 rows [m][k], op(B) as f32 rows [k][n]: the sums below then walk k in order
      // for every output element.
      for (int64_t i = 0; i < m; ++i)
        for (int64_t q = 0; q < k; ++q)
          ap[i * k + q] = load(A, p.ta, oa + (ta ? q + i * la->ld : i + q * la->ld));
      for (int64_t q = 0; q < k; ++q)
        for (int64_t j = 0; j < n; ++j)
          bp[q * n + j] = load(B, p.ta, ob + (tb ? j + q * lb->ld : q + j * lb->ld));
      if (p.tf32) {
        for (float& v : ap) v = round_tf32(v);
        for (float& v : bp) v = round_tf32(v);
      }
      std::fill(bias_acc.begin(), bias_acc.end(), 0.f);
      for (int64_t i = 0; i < m; ++i) {
        // acc[j] += op(A)[i, q] op(B)[q, j] over q in [q0, q1), in the algorithm's order.
        auto sum_k = [&](std::vector<float>& to, int64_t q0, int64_t q1, bool reverse) {
          std::fill(to.begin(), to.end(), 0.f);
          for (int64_t s = 0; s < q1 - q0; ++s) {
            const int64_t q = reverse ? q1 - 1 - s : q0 + s;
            const float av = ap[i * k + q];
            const float* brow = bp.data() + q * n;
            for (int64_t j = 0; j < n; ++j) to[j] += av * brow[j];
          }
        };
        if (variant == 2 || variant == 3) {
          sum_k(acc, 0, k / 2, false);
          sum_k(acc2, k / 2, k, false);
          for (int64_t j = 0; j < n; ++j)
            acc[j] = variant == 3 ? rounded_to(acc[j], p.tc) + rounded_to(acc2[j], p.tc)
                                  : acc[j] + acc2[j];
        } else {
          sum_k(acc, 0, k, variant == 1);
        }
        const float bias_v =
            (p.bits & kBias) ? load(dsc->bias, p.bias_type, bt * dsc->bias_batch_stride + i) : 0.f;
        for (int64_t j = 0; j < n; ++j) {
          float x = alpha * acc[j];
          if (beta != 0.f) x += beta * load(C, p.tc, oc + i + j * lc->ld);
          if (p.bits & kBias) x += bias_v;
          const int64_t aux_i = bt * dsc->aux_batch_stride + i + j * dsc->aux_ld;
          if (p.bits & kAuxOut) store(dsc->aux, p.aux_type, aux_i, x);
          if (p.bits & kGelu) x = gelu(x);
          if (p.bits & kDGelu) x = x * gelu_grad_approx(load(dsc->aux, p.aux_type, aux_i));
          if (p.bits & kBgradD) bias_acc[i] += rounded_to(x, p.tc);
          store(D, p.tc, od + i + j * ld->ld, x);
        }
      }
      if (p.bits & kBgradD)
        for (int64_t i = 0; i < m; ++i) store(dsc->bias, p.bias_type, i, bias_acc[i]);
      if (p.bits & kBgradA) {
        for (int64_t i = 0; i < m; ++i) {
          float sum = 0.f;
          for (int64_t q = 0; q < k; ++q) sum += ap[i * k + q];
          store(dsc->bias, p.bias_type, i, sum);
        }
      }
      if (p.bits & kBgradB) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t q = 0; q < k; ++q)
          for (int64_t j = 0; j < n; ++j) acc[j] += bp[q * n + j];
        for (int64_t j = 0; j < n; ++j) store(dsc->bias, p.bias_type, j, acc[j]);
      }
    }
  };
  strata::cuda_emu::enqueue(stream, std::move(run));
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
