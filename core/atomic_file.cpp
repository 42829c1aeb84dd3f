#include "core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.h"

namespace strata {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) user_error("{}: cannot create ({})", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  STRATA_CHECK(fd_ >= 0 && !committed_, "write to a committed AtomicFile {}", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      user_error("{}: write failed ({}){}", tmp_, w < 0 ? std::strerror(errno) : "no progress",
                 w < 0 && (errno == ENOSPC || errno == EDQUOT) ? "; free space on that disk" : "");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  STRATA_CHECK(fd_ >= 0 && !committed_, "write to a committed AtomicFile {}", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      user_error("{}: write failed ({}){}", tmp_, w < 0 ? std::strerror(errno) : "no progress",
                 w < 0 && (errno == ENOSPC || errno == EDQUOT) ? "; free space on that disk" : "");
    }
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  STRATA_CHECK(fd_ >= 0 && !committed_, "AtomicFile {} committed twice", path_);
  if (::fsync(fd_) != 0) user_error("{}: fsync failed ({})", tmp_, std::strerror(errno));
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) user_error("{}: close failed ({})", tmp_, std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    user_error("{}: cannot rename {} into place ({})", path_, tmp_, std::strerror(errno));
  }
  committed_ = true;
  fsync_directory(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) user_error("{}: cannot open the directory to fsync ({})", dir, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) user_error("{}: fsync of the directory failed ({})", dir, std::strerror(err));
}

std::string read_whole_file(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    if (std::cin.bad()) user_error("standard input: read failed");
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("{}: cannot open for reading ({})", path, std::strerror(errno));
  ss << in.rdbuf();
  if (in.bad()) user_error("{}: read failed", path);
  return ss.str();
}

}  // namespace strata
