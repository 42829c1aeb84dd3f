// cuBLASLt algorithm tuning: times the heuristic's candidates for each new GEMM problem and
// records the choice in the tuning file (matmul_tuning.h).
//
// Note [cuBLASLt tuning]
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
#include "tensor/cuda/matmul_tuning.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/split_k.h"

namespace strata::tensor::cuda {

namespace {

constexpr int kTuneCandidates = 8;
constexpr int kTuneRuns = 5;
static_assert(kTuneRuns % 2 == 1, "the median of the runs is one of them");
constexpr double kTuneMargin = 0.02;
constexpr const char* kTuningMagic = "# strata matmul tuning v2";
// v1 files' problems had no TF32 field (Note [TF32]): such a file is moved aside like one made
// for another GPU, and tuning starts over.
constexpr const char* kTuningMagicV1 = "# strata matmul tuning v1";
constexpr size_t kKeyFields = std::tuple_size_v<Key>;

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

}  // namespace

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

// The problem in words, for logs and cuda_matmul_choices().
std::string describe(const Key& key) {
  const auto f = key_fields(key);
  return fmt::format("m={} n={} k={} batch={} {}{} {}{} -> {}{} epilogue {}", f[0], f[1], f[2],
                     f[3], f[4] ? "a^T" : "a", f[5] ? " b^T" : " b",
                     dtype_name(static_cast<DType>(f[6])), f[15] ? " (tf32)" : "",
                     dtype_name(static_cast<DType>(f[7])), f[9] ? " (accumulate)" : "",
                     epilogue_name(static_cast<cublasLtEpilogue_t>(f[11])));
}

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
