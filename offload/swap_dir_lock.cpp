#include "offload/swap_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace strata::offload {

namespace {

// Whether process `pid` exists (EPERM: it does, under another user).
bool alive(pid_t pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  in >> pid;
  return in ? static_cast<pid_t>(pid) : 0;
}

// Removes strata-swap-<pid>-*.bin in `dir`; returns how many.
int remove_swap_files(const std::string& dir, pid_t pid) {
  const std::string prefix = "strata-swap-" + std::to_string(pid) + "-";
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && e.path().extension() == ".bin" &&
        std::filesystem::remove(e.path(), ec))
      ++removed;
  }
  return removed;
}

}  // namespace

SwapDirLock::SwapDirLock(const std::string& dir, const std::string& tag)
    : path_(dir + "/strata-" + tag + ".lock") {
  const pid_t self = ::getpid();
  // Two tries: the second after a stale lock was removed.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const std::string text = std::to_string(self) + "\n";
      const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      if (!ok) {
        ::unlink(path_.c_str());
        user_error("cannot write the swap lock file {}: {}", path_, std::strerror(errno));
      }
      return;
    }
    if (errno != EEXIST)
      user_error("cannot create the swap lock file {} ({}): nvme_path must be a writable directory",
                 path_, std::strerror(errno));
    const pid_t holder = read_pid(path_);
    if (holder == self)
      user_error(
          "swap lock {} is already held by this process: two swap stores of one run were "
          "given the same nvme_path and tag",
          path_);
    if (alive(holder))
      user_error(
          "nvme_path '{}' is in use by another run (process {} holds {}); give this run its "
          "own nvme_path or wait for that run to end",
          dir, holder, path_);
    // Stale: the holder died without cleaning up.
    stale_removed_ += remove_swap_files(dir, holder);
    ::unlink(path_.c_str());
  }
  user_error("cannot take the swap lock file {}: another process keeps recreating it", path_);
}

SwapDirLock::~SwapDirLock() {
  if (read_pid(path_) == ::getpid()) ::unlink(path_.c_str());
}

}  // namespace strata::offload
