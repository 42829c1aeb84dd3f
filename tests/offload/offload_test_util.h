#pragma once
// Helpers shared by the offload tests: scratch directories, random bytes, child processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "offload/aio_engine.h"

namespace strata::offload::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/strata-offload-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(rng() >> 56);
  return v;
}

// Runs fn in a child process and returns what it wrote to `out` (e.g. an error message) plus
// its exit status. For faults that need another uid or process-wide limits.
struct ChildResult {
  int status = -1;
  std::string out;
};
inline ChildResult run_in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string s;
    int code = 0;
    try {
      s = fn();
    } catch (const std::exception& e) {
      s = std::string("exception: ") + e.what();
      code = 3;
    }
    ssize_t w = ::write(fds[1], s.data(), s.size());
    (void)w;
    ::_exit(code);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::vector<IoEngineKind> engine_kinds() {
  return {IoEngineKind::IoUring, IoEngineKind::Libaio};
}

inline std::string engine_param_name(const ::testing::TestParamInfo<IoEngineKind>& info) {
  return info.param == IoEngineKind::IoUring ? "IoUring" : "Libaio";
}

// Skips io_uring variants where the kernel refuses it, saying why.
#define STRATA_SKIP_IF_NO_ENGINE(kind)                                             \
  do {                                                                             \
    std::string why_;                                                              \
    if ((kind) == ::strata::offload::IoEngineKind::IoUring &&                      \
        !::strata::offload::AioEngine::io_uring_available(&why_))                  \
      GTEST_SKIP() << "io_uring not available here (" << why_ << "); libaio runs"; \
  } while (0)

}  // namespace strata::offload::testing
