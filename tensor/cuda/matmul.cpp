// CUDA matmul through cuBLASLt, its algorithm tuning, and the GEMM that linear.cpp shares
// (matmul.h).
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
//// Note [cuBLASLt tuning]
// cuBLASLt's heuristic ranks algorithms from a model of the GPU without running them, and its
// first is not always the fastest for a shape (tile and cluster shapes, stages and swizzles
// differ). With tuning on (tensor::set_cuda_matmul_tuning, or STRATA_MATMUL_TUNE=on), a problem
// seen for the first time (a Key) asks the heuristic for up to kTuneCandidates algorithms under
// the same preference (workspace cap, alignments, no in-place split-K, so every candidate is
// deterministic) and times each on the call's own operands: one untimed run, then kTuneRuns runs,
// each between two events; a candidate's time is the median of its runs, so one run that the
// device or the host delayed (noise only ever adds time) does not decide. It keeps the fastest,
// but the heuristic's first unless another is at least kTuneMargin faster, so timing noise alone
// does not move the choice; then the call runs with it. A candidate cuBLASLt refuses at launch is
// skipped. The trials write what the call writes (out, and the epilogue's aux or bias output) from
// the same inputs, so the call's own run leaves the right values. With beta != 0 out is read too:
// it is copied aside before the trials and copied back before every run and before the call's own.
// Bits: two algorithms may sum in different orders (tiles, split-K), and timings vary between
// runs, so two processes that tune may choose differently and disagree in the last bits. The
// tuning file keeps them equal. Every choice is appended to it as it is made: one line with the
// Key, the candidate's rank, the algorithm's 64 bytes (cublasLt.h: they restore with the same
// cuBLASLt version) and the times. A file that exists is read first, so a process using it takes
// the recorded algorithm for every problem it lists (once cublasLtMatmulAlgoCheck accepts it and
// a trial run succeeds; else the problem is timed again and the new line wins) and times only
// new ones: a rerun or a resume with the same file gives the same bits. The file's
// second line names the cuBLASLt version and the GPU; a file made with others is moved to
// <file>.old with a warning and tuning starts over, as is a file in the v1 format (problems
// without the TF32 field, Note [TF32]). A last line cut short (a crash while writing)
// is dropped with a warning; any other malformed line is a UserError naming the file and line.
// Inside a CudaMatmulTuningPause (`train` samples text in one: each generated token makes the
// sequence, and so every GEMM's m, one longer) a problem not yet tuned takes the heuristic's first
// algorithm and is neither timed nor recorded.
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
#include "tensor/cuda/profiler.h"
#include "tensor/cuda/split_k.h"

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

// The problem an algorithm was chosen for. The heuristic sees the bias and aux pointers (it is
// given them before it runs) but has no preference for their alignment, so their own alignments
// are part of the key too: an algorithm picked for a 256-byte aligned bias is not reused for one
// that is only 16-byte aligned. The last field says whether an f32 problem runs on TF32 (Note
// [TF32]): its algorithms are another compute type's.
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int, int, bool, bool,
                       uint32_t, int, int64_t, uint32_t, uint32_t, bool>;

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

// ---- tuning (Note [cuBLASLt tuning]) ----

constexpr int kTuneCandidates = 8;
constexpr int kTuneRuns = 5;
static_assert(kTuneRuns % 2 == 1, "the median of the runs is one of them");
constexpr double kTuneMargin = 0.02;
constexpr const char* kTuningMagic = "# strata matmul tuning v2";
// v1 files' problems had no TF32 field (Note [TF32]): such a file is moved aside like one made
// for another GPU, and tuning starts over.
constexpr const char* kTuningMagicV1 = "# strata matmul tuning v1";
constexpr size_t kKeyFields = std::tuple_size_v<Key>;

struct Tuning {
  std::mutex mu;
  bool configured = false;  // set by set_matmul_tuning or read from the environment
  bool on = false;
  std::string file;
  bool file_read = false;
  std::map<Key, std::pair<int, cublasLtMatmulAlgo_t>> recorded;  // from the file: rank, algo
  std::vector<CudaMatmulChoice> choices;
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algos;    // every problem's algorithm
  int paused = 0;                                              // live CudaMatmulTuningPause scopes
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> untuned;  // first met while paused
};

Tuning& tuning() {
  static Tuning t;
  return t;
}

void configure_from_env(Tuning& t) {
  if (t.configured) return;
  t.configured = true;
  t.on = env_choice(
             "STRATA_MATMUL_TUNE",
             {{"off", "cuBLASLt's heuristic picks each matmul's algorithm"},
              {"on", "time the heuristic's best algorithms per problem, keep the fastest"}}) == 1;
  const char* f = std::getenv("STRATA_MATMUL_TUNE_FILE");
  t.file = f ? f : "";
}

std::array<int64_t, kKeyFields> key_fields(const Key& key) {
  return std::apply(
      [](auto... v) { return std::array<int64_t, kKeyFields>{static_cast<int64_t>(v)...}; }, key);
}

Key key_from_fields(const std::array<int64_t, kKeyFields>& f) {
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return Key{static_cast<std::tuple_element_t<I, Key>>(f[I])...};
  }
  (std::make_index_sequence<kKeyFields>{});
}

// The problem in words, for logs and cuda_matmul_choices().
std::string describe(const Key& key) {
  const auto f = key_fields(key);
  return fmt::format("m={} n={} k={} batch={} {}{} {}{} -> {}{} epilogue {}", f[0], f[1], f[2],
                     f[3], f[4] ? "a^T" : "a", f[5] ? " b^T" : " b",
                     dtype_name(static_cast<DType>(f[6])), f[15] ? " (tf32)" : "",
                     dtype_name(static_cast<DType>(f[7])), f[9] ? " (accumulate)" : "",
                     epilogue_name(static_cast<cublasLtEpilogue_t>(f[11])));
}

// The file's second line: what its algorithms are valid for.
std::string tuning_origin() {
  int dev = 0;
  cudaDeviceProp prop{};
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  return fmt::format("# cublasLt {} sm_{}{} {}", cublasLtGetVersion(), prop.major, prop.minor,
                     prop.name);
}

// Reads the tuning file into t.recorded (Note [cuBLASLt tuning]); a missing file is an empty one.
void read_tuning_file(Tuning& t) {
  namespace fs = std::filesystem;
  t.file_read = true;
  const std::string& path = t.file;
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    user_error(
        "matmul tuning file '{}' cannot be read; fix its permissions, or delete it to tune "
        "again",
        path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t last_newline = text.rfind('\n');
  const size_t keep = last_newline == std::string::npos ? 0 : last_newline + 1;
  if (keep < text.size()) {
    log::warn(
        "matmul tuning file '{}': its last line was cut short (a crash while it was written?); "
        "dropping it",
        path);
    fs::resize_file(path, keep, ec);
    if (ec)
      user_error(
          "matmul tuning file '{}': cannot drop its cut-short last line: {}; delete the "
          "file to tune again",
          path, ec.message());
    text.resize(keep);
  }
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  if (lines.empty()) return;
  // A file this process cannot use is moved to <file>.old and tuning starts over.
  auto set_aside = [&](const std::string& why) {
    log::warn(
        "matmul tuning file '{}' {}: moving it to '{}.old' and tuning again; runs with it cannot "
        "be reproduced here",
        path, why, path);
    fs::rename(path, path + ".old", ec);
    if (ec)
      user_error(
          "matmul tuning file '{}' {} and cannot be moved aside: {}; delete it to tune again", path,
          why, ec.message());
  };
  if (lines[0] == kTuningMagicV1)
    return set_aside("is in the v1 format, which predates TF32 problems");
  if (lines[0] != kTuningMagic)
    user_error(
        "{}:1: not a Strata matmul tuning file (its first line should be '{}'); point the "
        "tuning file elsewhere or delete it",
        path, kTuningMagic);
  const std::string origin = tuning_origin();
  if (lines.size() < 2 || lines[1] != origin)
    return set_aside(fmt::format("was made for '{}', not '{}' (this cuBLASLt and GPU)",
                                 lines.size() < 2 ? std::string("?") : lines[1].substr(2),
                                 origin.substr(2)));
  for (size_t i = 2; i < lines.size(); ++i) {
    std::istringstream ls(lines[i]);
    std::array<int64_t, kKeyFields> f{};
    int rank = -1;
    cublasLtMatmulAlgo_t algo{};
    double ms = 0, first_ms = 0;
    bool ok = true;
    for (auto& v : f) ok = ok && static_cast<bool>(ls >> v);
    ok = ok && static_cast<bool>(ls >> rank) && rank >= 0 && rank < kTuneCandidates;
    for (auto& w : algo.data) ok = ok && static_cast<bool>(ls >> std::hex >> w >> std::dec);
    ok = ok && static_cast<bool>(ls >> ms >> first_ms);
    std::string rest;
    ok = ok && !(ls >> rest);
    if (!ok)
      user_error(
          "{}:{}: malformed matmul tuning line '{}' (expected {} integers for the problem, "
          "the candidate's rank, 8 hexadecimal words and 2 times); delete the file to tune "
          "again",
          path, i + 1, lines[i], kKeyFields);
    // A problem timed again (its recorded algorithm refused) is appended again: the last wins.
    t.recorded.insert_or_assign(key_from_fields(f), std::make_pair(rank, algo));
  }
}

void append_choice(const Tuning& t, const Key& key, int rank, const cublasLtMatmulAlgo_t& algo,
                   double ms, double first_ms) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool fresh = !fs::exists(t.file, ec) || fs::file_size(t.file, ec) == 0;
  std::string line = fresh ? fmt::format("{}\n{}\n", kTuningMagic, tuning_origin()) : "";
  for (int64_t v : key_fields(key)) line += fmt::format("{} ", v);
  line += fmt::format("{}", rank);
  for (uint64_t w : algo.data) line += fmt::format(" {:016x}", w);
  line += fmt::format(" {:.6f} {:.6f}\n", ms, first_ms);
  std::FILE* f = std::fopen(t.file.c_str(), "ab");
  if (f == nullptr)
    user_error("matmul tuning file '{}' cannot be written: {}; pick a writable path", t.file,
               std::strerror(errno));
  const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  const bool closed = std::fflush(f) == 0 && std::fclose(f) == 0;
  if (!written || !closed)
    user_error(
        "matmul tuning file '{}' could not be written ({}); free some space or pick another "
        "path",
        t.file, std::strerror(errno));
}

// What a tuning trial runs: the call's cublasLtMatmul with algorithm `algo`.
struct GemmCall {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const void *a, *b;
  void* out;
  size_t out_bytes;
  float alpha, beta;
  void* workspace;
  cudaStream_t stream;
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo) const {
    return cublasLtMatmul(lt, op, &alpha, b, la, a, lb, &beta, out, lc, out, lc, &algo, workspace,
                          static_cast<size_t>(kWorkspaceBytes), stream);
  }
};

// Times the heuristic's first kTuneCandidates algorithms and returns the one to keep (Note
// [cuBLASLt tuning]), or nothing when none runs.
std::optional<cublasLtMatmulAlgo_t> tune(Tuning& t, const Key& key, const GemmCall& call,
                                         cublasLtMatmulPreference_t pref, Device device) {
  if (!t.file.empty() && !t.file_read) read_tuning_file(t);

  // With beta != 0 out is an input: each run starts from its saved value.
  Tensor saved;
  if (call.beta != 0.f) {
    offload::CategoryScope scope(offload::Category::Workspace);
    saved = Tensor::empty({static_cast<int64_t>(call.out_bytes)}, DType::U8, device);
    check_cuda(cudaMemcpyAsync(saved.data_ptr(), call.out, call.out_bytes, cudaMemcpyDeviceToDevice,
                               call.stream),
               "matmul tuning: save out");
  }
  auto restore = [&] {
    if (saved.defined())
      check_cuda(cudaMemcpyAsync(call.out, saved.data_ptr(), call.out_bytes,
                                 cudaMemcpyDeviceToDevice, call.stream),
                 "matmul tuning: restore out");
  };

  // A recorded algorithm is used when cuBLASLt accepts it for this problem and runs it once: a
  // file from elsewhere or edited by hand can hold one that passes cublasLtMatmulAlgoCheck but
  // that cublasLtMatmul refuses (an alignment it does not have here), which would otherwise
  // fail the step's own GEMM. A refused run enqueues nothing; the trial run's output is undone.
  if (auto r = t.recorded.find(key); r != t.recorded.end()) {
    cublasLtMatmulHeuristicResult_t check{};
    cublasStatus_t st = cublasLtMatmulAlgoCheck(call.lt, call.op, call.la, call.lb, call.lc,
                                                call.lc, &r->second.second, &check);
    if (st == CUBLAS_STATUS_SUCCESS &&
        (check.workspaceSize > static_cast<size_t>(kWorkspaceBytes) ||
         !reduction_allowed(r->second.second)))
      st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) st = call.run(r->second.second);
    restore();
    if (st == CUBLAS_STATUS_SUCCESS) {
      t.choices.push_back({describe(key), r->second.first, 0, 0.0, 0.0, true});
      return r->second.second;
    }
    log::warn(
        "matmul tuning file '{}': cuBLASLt refuses the algorithm recorded for {} (status {}); "
        "timing the candidates again",
        t.file, describe(key), static_cast<int>(st));
  }
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      call.lt, call.op, call.la, call.lb, call.lc, call.lc, pref, kTuneCandidates, results, &found);
  if (heuristic != CUBLAS_STATUS_SUCCESS || found < 1) return std::nullopt;

  std::vector<cudaEvent_t> events(2 * kTuneRuns);
  for (auto& e : events) check_cuda(cudaEventCreate(&e), "matmul tuning: cudaEventCreate");
  struct EventGuard {
    std::vector<cudaEvent_t>& e;
    ~EventGuard() {
      for (cudaEvent_t x : e) cudaEventDestroy(x);
    }
  } guard{events};

  const double never = std::numeric_limits<double>::infinity();
  std::vector<double> ms(static_cast<size_t>(found), never);
  for (int c = 0; c < found; ++c) {
    if (results[c].state != CUBLAS_STATUS_SUCCESS) continue;
    restore();
    if (call.run(results[c].algo) != CUBLAS_STATUS_SUCCESS) continue;  // refused: skipped
    bool ran = true;
    for (int r = 0; r < kTuneRuns && ran; ++r) {
      restore();
      check_cuda(cudaEventRecord(events[2 * r], call.stream), "matmul tuning: cudaEventRecord");
      ran = call.run(results[c].algo) == CUBLAS_STATUS_SUCCESS;
      check_cuda(cudaEventRecord(events[2 * r + 1], call.stream), "matmul tuning: cudaEventRecord");
    }
    if (!ran) continue;
    check_cuda(cudaEventSynchronize(events.back()), "matmul tuning: cudaEventSynchronize");
    std::array<double, kTuneRuns> runs{};
    for (int r = 0; r < kTuneRuns; ++r) {
      float one = 0;
      check_cuda(cudaEventElapsedTime(&one, events[2 * r], events[2 * r + 1]),
                 "matmul tuning: cudaEventElapsedTime");
      runs[static_cast<size_t>(r)] = one;
    }
    std::nth_element(runs.begin(), runs.begin() + kTuneRuns / 2, runs.end());
    ms[static_cast<size_t>(c)] = runs[kTuneRuns / 2];  // the median (kTuneRuns is odd)
  }
  restore();
  int best = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  if (ms[static_cast<size_t>(best)] == never) return std::nullopt;  // none ran
  if (ms[0] != never && ms[static_cast<size_t>(best)] > ms[0] * (1.0 - kTuneMargin)) best = 0;
  const double best_ms = ms[static_cast<size_t>(best)];
  const double first_ms = ms[0] == never ? 0.0 : ms[0];
  log::info("matmul tuning: {}: candidate {} of {}, {:.3f} ms (the heuristic's first: {:.3f} ms)",
            describe(key), best, found, best_ms, first_ms);
  t.choices.push_back({describe(key), best, found, best_ms, first_ms, false});
  if (!t.file.empty()) append_choice(t, key, best, results[best].algo, best_ms, first_ms);
  return results[best].algo;
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

void set_matmul_tuning(bool on, const std::string& file) {
  Tuning& t = tuning();
  std::lock_guard<std::mutex> lock(t.mu);
  t.configured = true;
  t.on = on;
  t.file = on ? file : "";
  t.file_read = false;
  t.recorded.clear();
  t.choices.clear();
  t.algos.clear();
  t.untuned.clear();
}

void set_tf32(bool on) {
  g_tf32.store(on, std::memory_order_relaxed);
}

bool tf32() {
  return g_tf32.load(std::memory_order_relaxed);
}

void pause_matmul_tuning(int delta) {
  Tuning& t = tuning();
  std::lock_guard<std::mutex> lock(t.mu);
  t.paused += delta;
}

std::vector<CudaMatmulChoice> matmul_choices() {
  Tuning& t = tuning();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.choices;
}

}  // namespace strata::tensor::cuda
