#pragma once
// Files that are either whole or absent (docs/design.md decision 12).
//
// Note [Atomic files]
// Every file Strata writes that a later run reads (shards, safetensors, checkpoint state,
// configs, metrics) goes through AtomicFile: bytes go to `<path>.tmp.<pid>` in the same
// directory (so the rename stays on one filesystem), the file is fsynced, renamed over `path`,
// and the directory is fsynced so the rename itself survives a crash. A writer destroyed
// without commit() — an exception on the way, a full disk — removes its temporary, so a failure
// leaves the previous file untouched and nothing half-written. Errors are strata::user_error
// naming the path and the system's reason.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Writes at byte `offset` of the file (pwrite): a writer that knows the layout up front fills
  // it in any order (tensor::SafetensorsWriter). Does not move write()'s position.
  void write_at(uint64_t offset, const void* data, size_t n);
  // fsync, rename into place, fsync the directory.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return tmp_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `bytes` as `path`, through AtomicFile.
void write_file_atomically(const std::string& path, std::string_view bytes);

// fsync of a directory (after creating or renaming entries in it).
void fsync_directory(const std::string& dir);

// The bytes of the file at `path`; "-" reads standard input to its end. strata::user_error
// naming the path (and the system's reason) when it cannot be opened or read.
std::string read_whole_file(const std::string& path);

}  // namespace strata
