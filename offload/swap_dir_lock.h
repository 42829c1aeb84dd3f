#pragma once
// SwapDirLock: one run's claim on its NVMe swap files in a directory (nvme_path).
//
// Note [Swap directory lock]
// NvmeStore names its files by process id (Note [NVMe store layout]), so two stores never write
// the same file; what the lock adds is a policy between runs. A run that swaps through a
// directory takes a lock file there, strata-<tag>.lock (tag: what it swaps and for which rank,
// e.g. optimizer-rank0), holding its process id. A second live process asking for the same tag
// in the same directory is refused with an error naming the lock file and the holder's pid: two
// runs configured with one nvme_path would otherwise compete for its space and bandwidth and
// race each other's cleanup. A lock whose process is gone (killed, so its destructors never
// ran) is stale: it is taken over, and the dead process's swap files
// (strata-swap-<pid>-*.bin) are removed first. The lock file goes when the lock is destroyed.
#include <sys/types.h>
#include <string>

namespace strata::offload {

class SwapDirLock {
 public:
  // Raises a UserError naming the lock file when a live process holds it or the directory does
  // not take the file.
  SwapDirLock(const std::string& dir, const std::string& tag);
  ~SwapDirLock();
  SwapDirLock(const SwapDirLock&) = delete;
  SwapDirLock& operator=(const SwapDirLock&) = delete;

  const std::string& path() const { return path_; }
  // Swap files of a dead holder removed when the lock was taken over.
  int stale_files_removed() const { return stale_removed_; }

 private:
  std::string path_;
  int stale_removed_ = 0;
};

}  // namespace strata::offload
