#pragma once
// The NVMe tier: a store of fixed-size, 4 KiB-aligned blocks in files under `nvme_path`.
//
// Note [NVMe store layout]
// The store is scratch space for one process: files named strata-swap-<pid>-<n>-<i>.bin are
// created in each configured path and removed when the store is destroyed. Storage is handed
// out in blocks of `block_bytes` (a multiple of 4096). Global block g lives in file g % F at
// offset (g / F) * block_bytes, so consecutive blocks of a buffer are striped over the F files
// (one per path: several drives add their bandwidth). Blocks are reserved with fallocate when
// the store grows, so a full disk is reported when a buffer is allocated, not halfway through
// a swap-out.
//
// Note [NVMe blocks are not addressable]
// NvmeStore implements the Allocator interface so the tier is accounted like the others, but a
// Block it returns has a `ptr` that is an opaque key, not memory: never dereference it. Data
// moves only through write() and read().
//
// Note [Checksums and alignment]
// With `checksum` on, write() records a 64-bit checksum (offload/checksum.h) of every block's
// bytes and read() verifies each block once its I/O completes (Note [Checksums overlap the I/O]
// in nvme_store.cpp says when and where), so a block
// that was overwritten, truncated or torn on disk is an error naming the file and offset, never
// silently wrong data. The table lives in memory: the files are scratch, not a format. Under
// O_DIRECT, 4 KiB-aligned caller buffers are transferred in place except for a size's last
// partial 4 KiB, which goes through a small bounce page; misaligned buffers go through a bounce
// buffer whole. A read's data is in the caller's buffer once wait() or poll() returned true.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "offload/aio_engine.h"
#include "offload/allocator.h"

namespace strata::offload {

enum class ODirect { Auto, On, Off };  // o_direct: auto|true|false

struct NvmeConfig {
  std::vector<std::string> paths;        // nvme_path; several are striped
  size_t block_bytes = size_t{1} << 20;  // allocation and checksum unit
  ODirect o_direct = ODirect::Auto;
  bool checksum = true;
  AioConfig aio;
};

class NvmeStore final : public Allocator {
 public:
  explicit NvmeStore(NvmeConfig config, MemoryStats* stats = &MemoryStats::global());
  ~NvmeStore() override;  // waits for in-flight I/O, removes the files
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Reserves blocks_for(bytes, block_bytes) blocks; raises a UserError naming the path when full.
  Block allocate(size_t bytes, Category category) override;
  // The blocks an extent of `bytes` takes: ceil(bytes / block_bytes), at least one. What a plan
  // of the disk space a run needs counts (runtime/nvme_space_plan.h).
  static size_t blocks_for(size_t bytes, size_t block_bytes);
  using Allocator::allocate;
  void deallocate(const Block& block) override;  // the block's I/O must have completed
  Tier tier() const override { return Tier::Nvme; }

  // Writes `bytes` (<= dst.bytes) from src; src must stay valid until the handle completes.
  IoHandle write(const Block& dst, const void* src, size_t bytes);
  // Reads the first `bytes` of src into dst (valid after wait()/poll()).
  IoHandle read(const Block& src, void* dst, size_t bytes);

  bool direct() const { return direct_; }
  bool checksum() const { return config_.checksum; }
  size_t block_bytes() const { return config_.block_bytes; }
  const std::vector<std::string>& files() const { return file_paths_; }
  AioEngine& engine() { return *engine_; }
  size_t blocks_in_use() const;
  size_t blocks_reserved() const;  // in the files: in use or free

 private:
  struct Extent {
    std::vector<uint64_t> blocks;
    std::vector<uint64_t> sums;  // per block, valid once written
    size_t written = 0;          // bytes the last write covered
    uint64_t generation = 0;     // writes submitted so far; a write's completion checks it
    std::string lost;            // why the contents are gone (a failed write), if they are
    Category category;
    size_t bytes;
  };
  struct BlockProgress;  // see Note [Checksums overlap the I/O]
  struct File {
    int fd = -1;
    std::string path;
    dev_t dev = 0;
    ino_t ino = 0;
    uint64_t size = 0;  // bytes reserved
  };

  void open_files();
  void check_files() const;  // raises if a file was removed or replaced under us
  std::vector<IoOp> plan(const Extent& e, char* buf, size_t bytes, bool write) const;
  Extent& extent(const Block& b);

  NvmeConfig config_;
  MemoryStats* stats_;
  bool direct_ = false;
  std::vector<File> files_;
  std::vector<std::string> file_paths_;
  std::unique_ptr<AioEngine> engine_;
  mutable std::mutex mu_;
  std::set<uint64_t> free_blocks_;
  uint64_t next_block_ = 0;
  uintptr_t next_key_ = 1;
  std::map<uintptr_t, std::shared_ptr<Extent>> extents_;
};

}  // namespace strata::offload
