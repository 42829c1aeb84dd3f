#pragma once
// Helpers for tests that run the tools' binaries and build small data sets on disk.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace strata::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "strata_tools_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    path_ = ::mkdtemp(buf.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shard in the llm.c layout; every header field can be set wrong on purpose.
struct RawShard {
  std::vector<uint16_t> tokens;
  int32_t magic = 20240520;
  int32_t version = 1;
  int64_t count = -1;       // header token count; -1 = tokens.size()
  int32_t vocab_hint = 0;   // header[3]
  int64_t keep_bytes = -1;  // truncate the file to this many bytes; -1 = whole file
};

inline void write_raw_shard(const std::string& path, const RawShard& s) {
  std::vector<int32_t> header(256, 0);
  header[0] = s.magic;
  header[1] = s.version;
  header[2] = static_cast<int32_t>(s.count >= 0 ? s.count : static_cast<int64_t>(s.tokens.size()));
  header[3] = s.vocab_hint;
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  bytes.append(reinterpret_cast<const char*>(s.tokens.data()), s.tokens.size() * 2);
  if (s.keep_bytes >= 0) bytes.resize(static_cast<size_t>(s.keep_bytes));
  write_text(path, bytes);
}

// Deterministic pseudo-text tokens: a repeating pattern a tiny model can learn.
inline std::vector<uint16_t> pattern_tokens(size_t n, uint16_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint16_t>((i % 7 == 0) ? rng() % vocab : (out[i - 1] * 3 + 1) % vocab);
  }
  return out;
}

struct CommandResult {
  int exit_code = -1;  // -1: did not exit in time (killed)
  std::string out;
  std::string err;
};

// Runs argv[0] with arguments, capturing stdout/stderr into files, killing it after `timeout`.
// `on_started(pid)` (optional) runs once the child has started, e.g. to send it a signal.
template <typename OnStarted>
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                          OnStarted&& on_started, const std::string& cwd = "") {
  char out_tmpl[] = "/tmp/strata_cmd_out_XXXXXX";
  char err_tmpl[] = "/tmp/strata_cmd_err_XXXXXX";
  int out_fd = ::mkstemp(out_tmpl);
  int err_fd = ::mkstemp(err_tmpl);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  on_started(pid);
  CommandResult r;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::close(out_fd);
  ::close(err_fd);
  r.out = read_text(out_tmpl);
  r.err = read_text(err_tmpl);
  ::unlink(out_tmpl);
  ::unlink(err_tmpl);
  return r;
}

inline CommandResult run_command(const std::vector<std::string>& argv,
                                 std::chrono::seconds timeout = std::chrono::seconds(120),
                                 const std::string& cwd = "") {
  return run_command(
      argv, timeout, [](pid_t) {}, cwd);
}

// Paths under `root` whose name contains ".tmp" (left-over temporaries).
inline std::vector<std::string> leftover_temporaries(const std::string& root) {
  std::vector<std::string> out;
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().filename().string().find(".tmp") != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

}  // namespace strata::testing
