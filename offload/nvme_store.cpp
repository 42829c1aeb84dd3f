#include "offload/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "offload/checksum.h"

namespace strata::offload {
namespace {

constexpr size_t kPage = 4096;

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

// A 4 KiB-aligned scratch buffer that frees itself.
std::shared_ptr<char> bounce_buffer(size_t bytes) {
  void* p = std::aligned_alloc(kPage, round_up(std::max<size_t>(bytes, 1), kPage));
  if (p == nullptr) user_error("out of host memory for a {} byte NVMe bounce buffer", bytes);
  return std::shared_ptr<char>(static_cast<char*>(p), [](char* q) { std::free(q); });
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kPage == 0;
}

std::atomic<int> g_store_counter{0};

}  // namespace

// Note [Checksums overlap the I/O]
// Summing a whole buffer before submitting it, or verifying it after the whole read, would add
// the checksum's time (Note [Block checksum function]) to every transfer, and on a machine with
// few cores that time is comparable to the I/O's (docs/offload.md). Instead the engine runs a
// per-chunk hook as each chunk lands (Note [AIO engine]) and BlockProgress counts each block's
// bytes down; the chunk that completes a block sums (write) or verifies (read) it, while the rest
// of the request is in flight. A write's sums are published to its extent when the write completes;
// a read's mismatch fails its handle, so wait()/poll() raise it, naming the file and offset.
struct NvmeStore::BlockProgress {
  BlockProgress(size_t bytes, size_t bb)
      : bb_(bb), n_((bytes + bb - 1) / bb), left_(new std::atomic<size_t>[n_]), sums(n_) {
    for (size_t i = 0; i < n_; ++i) left_[i].store(std::min(bytes, (i + 1) * bb) - i * bb);
  }
  // Bytes [lo, hi) of the request have landed; runs done(i) for each block they complete.
  template <class F>
  void landed(size_t lo, size_t hi, F&& done) {
    for (size_t i = lo / bb_; i < n_ && i * bb_ < hi; ++i) {
      const size_t n = std::min(hi, (i + 1) * bb_) - std::max(lo, i * bb_);
      // acq_rel: the thread that completes a block sees the bytes other chunks copied into it.
      if (left_[i].fetch_sub(n, std::memory_order_acq_rel) == n) done(i);
    }
  }

 private:
  size_t bb_, n_;
  std::unique_ptr<std::atomic<size_t>[]> left_;

 public:
  std::vector<uint64_t> sums;  // write: filled per block as it completes
};

NvmeStore::NvmeStore(NvmeConfig config, MemoryStats* stats)
    : config_(std::move(config)), stats_(stats) {
  if (config_.paths.empty())
    user_error("nvme_path is empty: set it to a directory on the NVMe drive to offload to");
  if (config_.block_bytes < kPage || config_.block_bytes % kPage != 0)
    user_error("NVMe store block size {} must be a positive multiple of 4096", config_.block_bytes);
  config_.aio.validate();
  try {
    open_files();
    engine_ = std::make_unique<AioEngine>(config_.aio);
  } catch (...) {
    for (File& f : files_) {
      ::close(f.fd);
      ::unlink(f.path.c_str());
    }
    throw;
  }
}

NvmeStore::~NvmeStore() {
  engine_.reset();  // completes in-flight I/O before the files go
  for (File& f : files_) {
    ::close(f.fd);
    ::unlink(f.path.c_str());
  }
  for (auto& [key, e] : extents_)
    stats_->on_free(Tier::Nvme, e->category, static_cast<int64_t>(e->bytes));
}

void NvmeStore::open_files() {
  const int id = g_store_counter.fetch_add(1);
  const bool want_direct = config_.o_direct != ODirect::Off;
  direct_ = want_direct;
  for (size_t i = 0; i < config_.paths.size(); ++i) {
    const std::string& dir = config_.paths[i];
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno == ENOENT)
        user_error(
            "nvme_path '{}' does not exist: create it (mkdir -p) or point nvme_path at a "
            "directory on the NVMe drive",
            dir);
      user_error("nvme_path '{}' cannot be used: {}", dir, std::strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) user_error("nvme_path '{}' is not a directory", dir);
    File f;
    f.path = fmt::format("{}/strata-swap-{}-{}-{}.bin", dir, ::getpid(), id, i);
    const int base = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    f.fd = ::open(f.path.c_str(), base | (direct_ ? O_DIRECT : 0), 0600);
    if (f.fd < 0 && errno == EINVAL && direct_ && config_.o_direct == ODirect::Auto) {
      direct_ = false;
      f.fd = ::open(f.path.c_str(), base, 0600);
    }
    if (f.fd < 0) {
      const int err = errno;
      if (err == EACCES || err == EPERM || err == EROFS)
        user_error(
            "nvme_path '{}' is not writable ({}): fix its permissions or mount, or point "
            "nvme_path elsewhere",
            dir, std::strerror(err));
      if (err == EINVAL)
        user_error(
            "the filesystem of nvme_path '{}' does not support O_DIRECT: set o_direct: "
            "auto or false",
            dir);
      user_error("cannot create a swap file in nvme_path '{}': {}", dir, std::strerror(err));
    }
    files_.push_back(f);  // from here on, cleaned up if the constructor fails
    // Some filesystems accept O_DIRECT at open and reject it at the first I/O: probe once.
    auto page = bounce_buffer(kPage);
    std::memset(page.get(), 0, kPage);
    if (::pwrite(f.fd, page.get(), kPage, 0) != static_cast<ssize_t>(kPage)) {
      const int err = errno;
      if (err == EINVAL && direct_ && config_.o_direct == ODirect::Auto) {
        direct_ = false;
      } else if (err == EINVAL && direct_) {
        user_error(
            "the filesystem of nvme_path '{}' rejects O_DIRECT I/O: set o_direct: auto or "
            "false",
            dir);
      } else {
        user_error(
            "nvme_path '{}' is not writable ({}): free space there or point nvme_path "
            "elsewhere",
            dir, std::strerror(err));
      }
    }
    if (::ftruncate(files_.back().fd, 0) != 0)
      user_error("cannot truncate {}: {}", f.path, std::strerror(errno));
    struct stat fs {};
    ::fstat(f.fd, &fs);
    files_.back().dev = fs.st_dev;
    files_.back().ino = fs.st_ino;
  }
  if (want_direct && !direct_) {
    log::warn(
        "nvme_path {}: O_DIRECT not supported by the filesystem; using buffered I/O "
        "(o_direct: auto)",
        config_.paths[0]);
    for (File& f : files_) ::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) & ~O_DIRECT);
  }
  for (const File& f : files_) file_paths_.push_back(f.path);
}

void NvmeStore::check_files() const {
  for (const File& f : files_) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0 || st.st_ino != f.ino || st.st_dev != f.dev)
      user_error(
          "NVMe swap file {} was removed or replaced while in use: the data offloaded to "
          "it cannot be trusted. Keep cleanup jobs and other runs away from nvme_path",
          f.path);
  }
}

size_t NvmeStore::blocks_for(size_t bytes, size_t block_bytes) {
  return std::max<size_t>(1, (bytes + block_bytes - 1) / block_bytes);
}

Block NvmeStore::allocate(size_t bytes, Category category) {
  const uint64_t bb = config_.block_bytes;
  const size_t n = blocks_for(bytes, bb);
  const size_t nfiles = files_.size();
  auto e = std::make_shared<Extent>();
  e->category = category;
  e->bytes = bytes;
  std::lock_guard<std::mutex> lock(mu_);
  while (e->blocks.size() < n && !free_blocks_.empty()) {
    e->blocks.push_back(*free_blocks_.begin());
    free_blocks_.erase(free_blocks_.begin());
  }
  const size_t fresh = n - e->blocks.size();
  for (size_t k = 0; k < fresh; ++k) {
    const uint64_t g = next_block_ + k;
    File& f = files_[g % nfiles];
    const uint64_t need = (g / nfiles + 1) * bb;
    if (need <= f.size) continue;
    int r = ::fallocate(f.fd, 0, static_cast<off_t>(f.size), static_cast<off_t>(need - f.size));
    if (r != 0 && errno == EOPNOTSUPP) r = ::ftruncate(f.fd, static_cast<off_t>(need));
    if (r != 0) {
      const int err = errno;
      for (uint64_t b : e->blocks) free_blocks_.insert(b);
      if (err == ENOSPC || err == EDQUOT || err == EFBIG)
        user_error(
            "NVMe store is full: cannot grow {} to {:.1f} MiB for a {:.1f} MiB {} buffer "
            "({}). Free space there, point nvme_path at a larger drive, or offload less",
            f.path, need / 1048576.0, bytes / 1048576.0, category_name(category),
            std::strerror(err));
      user_error("cannot grow NVMe swap file {}: {}", f.path, std::strerror(err));
    }
    f.size = need;
  }
  for (size_t k = 0; k < fresh; ++k) e->blocks.push_back(next_block_ + k);
  next_block_ += fresh;
  const uintptr_t key = next_key_++;
  extents_.emplace(key, e);
  stats_->on_alloc(Tier::Nvme, category, static_cast<int64_t>(bytes));
  return {reinterpret_cast<void*>(key), bytes, category};
}

void NvmeStore::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = extents_.find(reinterpret_cast<uintptr_t>(block.ptr));
  STRATA_CHECK(it != extents_.end(), "NVMe block {} is not from this store", block.ptr);
  for (uint64_t b : it->second->blocks) free_blocks_.insert(b);
  stats_->on_free(Tier::Nvme, it->second->category, static_cast<int64_t>(it->second->bytes));
  extents_.erase(it);
}

size_t NvmeStore::blocks_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_block_ - free_blocks_.size();
}

size_t NvmeStore::blocks_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_block_;
}

// Ops for extent bytes [start, start + len) to or from buf, merging blocks that are adjacent in
// the same file.
static void plan_range(const std::vector<uint64_t>& blocks, size_t bb,
                       const std::vector<std::string>& paths, const std::vector<int>& fds,
                       size_t start, char* buf, size_t len, bool write, std::vector<IoOp>& ops) {
  const size_t nfiles = fds.size();
  size_t at = start;
  while (at < start + len) {
    const size_t bi = at / bb;
    const size_t in = at % bb;
    const size_t n = std::min(bb - in, start + len - at);
    const uint64_t g = blocks[bi];
    const int f = static_cast<int>(g % nfiles);
    const uint64_t off = (g / nfiles) * bb + in;
    IoOp* last = ops.empty() ? nullptr : &ops.back();
    if (last && last->fd == fds[f] && last->offset + last->len == off &&
        static_cast<char*>(last->buf) + last->len == buf + (at - start)) {
      last->len += n;
    } else {
      ops.push_back(IoOp{fds[f], write, buf + (at - start), n, off, paths[f], at});
    }
    at += n;
  }
}

std::vector<IoOp> NvmeStore::plan(const Extent& e, char* buf, size_t bytes, bool write) const {
  std::vector<int> fds;
  for (const File& f : files_) fds.push_back(f.fd);
  std::vector<IoOp> ops;
  plan_range(e.blocks, config_.block_bytes, file_paths_, fds, 0, buf, bytes, write, ops);
  return ops;
}

IoHandle NvmeStore::write(const Block& dst, const void* src, size_t bytes) {
  std::shared_ptr<Extent> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = extents_.find(reinterpret_cast<uintptr_t>(dst.ptr));
    STRATA_CHECK(it != extents_.end(), "NVMe block {} is not from this store", dst.ptr);
    e = it->second;
  }
  STRATA_CHECK(bytes <= e->bytes, "writing {} bytes into a {} byte NVMe buffer", bytes, e->bytes);
  check_files();
  const size_t bb = config_.block_bytes;
  char* data = const_cast<char*>(static_cast<const char*>(src));  // only read by the kernel
  std::vector<IoOp> ops;
  std::shared_ptr<char> bounce;
  if (direct_ && !aligned(src)) {
    bounce = bounce_buffer(bytes);
    std::memcpy(bounce.get(), src, bytes);
    std::memset(bounce.get() + bytes, 0, round_up(bytes, kPage) - bytes);
    ops = plan(*e, bounce.get(), round_up(bytes, kPage), true);
  } else if (direct_ && bytes % kPage != 0) {
    const size_t body = bytes / kPage * kPage;
    ops = plan(*e, data, body, true);
    bounce = bounce_buffer(kPage);
    std::memcpy(bounce.get(), data + body, bytes - body);
    std::memset(bounce.get() + (bytes - body), 0, kPage - (bytes - body));
    std::vector<int> fds;
    for (const File& f : files_) fds.push_back(f.fd);
    plan_range(e->blocks, bb, file_paths_, fds, body, bounce.get(), kPage, true, ops);
  } else {
    ops = plan(*e, data, bytes, true);
  }
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = ++e->generation;
    e->sums.clear();  // until this write completes, its blocks have no checksum to verify
    e->written = bytes;
    e->lost.clear();
  }
  // See Note [Checksums overlap the I/O]: each block is summed (from src, which the caller keeps
  // unchanged until completion) as soon as the chunks covering it are on disk.
  std::shared_ptr<BlockProgress> progress;
  AioEngine::ChunkHook on_chunk;
  if (config_.checksum) {
    progress = std::make_shared<BlockProgress>(bytes, bb);
    on_chunk = [progress, src = static_cast<const char*>(src), bytes, bb](const IoOp& c) {
      progress->landed(c.pos, std::min(c.pos + c.len, bytes), [&](size_t i) {
        const size_t lo = i * bb, hi = std::min(bytes, lo + bb);
        progress->sums[i] = checksum64(src + lo, hi - lo);
      });
    };
  }
  auto on_complete = [this, e, gen, progress](bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (e->generation != gen) return;  // a later write to the same buffer owns its state now
    if (!ok) {
      e->lost = "its last swap-out failed (see the error that write reported)";
      return;
    }
    if (progress) e->sums = std::move(progress->sums);
  };
  return engine_->submit(
      ops, [bounce](bool) {}, on_complete, std::move(on_chunk));
}

IoHandle NvmeStore::read(const Block& src, void* dst, size_t bytes) {
  std::shared_ptr<Extent> e;
  std::vector<uint64_t> sums;
  size_t written = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = extents_.find(reinterpret_cast<uintptr_t>(src.ptr));
    STRATA_CHECK(it != extents_.end(), "NVMe block {} is not from this store", src.ptr);
    e = it->second;
    if (!e->lost.empty())
      user_error("cannot read an NVMe {} buffer back from {}: {}", category_name(e->category),
                 file_paths_[0], e->lost);
    sums = e->sums;
    written = e->written;
  }
  STRATA_CHECK(bytes <= e->bytes, "reading {} bytes from a {} byte NVMe buffer", bytes, e->bytes);
  check_files();
  const size_t bb = config_.block_bytes;
  char* out = static_cast<char*>(dst);
  std::vector<IoOp> ops;
  std::shared_ptr<char> bounce;
  size_t copy_from = 0;  // bytes of out that come from bounce start here
  if (direct_ && !aligned(dst)) {
    bounce = bounce_buffer(bytes);
    ops = plan(*e, bounce.get(), round_up(bytes, kPage), false);
  } else if (direct_ && bytes % kPage != 0) {
    copy_from = bytes / kPage * kPage;
    ops = plan(*e, out, copy_from, false);
    bounce = bounce_buffer(kPage);
    std::vector<int> fds;
    for (const File& f : files_) fds.push_back(f.fd);
    plan_range(e->blocks, bb, file_paths_, fds, copy_from, bounce.get(), kPage, false, ops);
  } else {
    ops = plan(*e, out, bytes, false);
  }
  if (!bounce && sums.empty()) return engine_->submit(ops);
  // See Note [Checksums overlap the I/O]: staged bytes are copied out and each block verified as
  // soon as its chunks have landed, while the rest are still in flight.
  std::shared_ptr<BlockProgress> progress;
  if (!sums.empty()) progress = std::make_shared<BlockProgress>(bytes, bb);
  // The store outlives its in-flight I/O (the destructor drains the engine) and an extent's
  // blocks never change, so a mismatch can name the block's file and offset from them.
  auto on_chunk = [this, e, out, bytes, bounce, copy_from, progress, sums = std::move(sums),
                   written, bb](const IoOp& c) {
    const size_t lo = c.pos, hi = std::min(c.pos + c.len, bytes);
    if (lo >= hi) return;           // only the padding of the last page
    if (bounce && lo >= copy_from)  // staged: [0, copy_from) was read in place
      std::memcpy(out + lo, bounce.get() + (lo - copy_from), hi - lo);
    if (!progress) return;
    progress->landed(lo, hi, [&](size_t i) {
      if (i >= sums.size()) return;
      const size_t b_lo = i * bb, b_hi = std::min(written, b_lo + bb);
      if (b_hi > bytes) return;  // the read did not cover this whole block
      if (checksum64(out + b_lo, b_hi - b_lo) == sums[i]) return;
      const uint64_t g = e->blocks[i];
      user_error(
          "checksum mismatch reading {} at offset {} ({} bytes): the data on disk is not what "
          "was written. The file was changed under Strata or the drive corrupted it",
          file_paths_[g % files_.size()], (g / files_.size()) * bb, b_hi - b_lo);
    });
  };
  return engine_->submit(ops, {}, {}, std::move(on_chunk));
}

}  // namespace strata::offload
