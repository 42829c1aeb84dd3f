#include "offload/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "offload_test_util.h"

namespace strata::offload {
namespace {

using testing::TempDir;

// Runs fn, expecting a UserError whose message contains every one of `parts`.
template <typename Fn>
void expect_user_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
  }
}

NvmeConfig small_config(std::vector<std::string> paths, IoEngineKind kind) {
  NvmeConfig c;
  c.paths = std::move(paths);
  c.block_bytes = 64 * 1024;
  c.aio.engine = kind;
  c.aio.block_size = 32 * 1024;
  c.aio.queue_depth = 8;
  return c;
}

class NvmeStoreTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_NO_ENGINE(GetParam()); }
  NvmeConfig config(std::vector<std::string> paths) const {
    return small_config(std::move(paths), GetParam());
  }
  TempDir a_, b_;
};

// Random sizes (most not a multiple of 4 KiB), aligned and misaligned buffers, striped over two
// paths, every buffer in flight at once; O_DIRECT and buffered; checksums on and off.
TEST_P(NvmeStoreTest, RoundTripsRandomSizesBitExact) {
  for (ODirect od : {ODirect::On, ODirect::Off}) {
    for (bool sums : {true, false}) {
      MemoryStats stats;
      NvmeConfig c = config({a_.path(), b_.path()});
      c.o_direct = od;
      c.checksum = sums;
      NvmeStore store(c, &stats);
      EXPECT_EQ(store.direct(), od == ODirect::On);
      EXPECT_EQ(store.files().size(), 2u);
      std::mt19937_64 rng(5);
      const int n = 20;
      std::vector<std::vector<unsigned char>> data;
      std::vector<Block> blocks;
      std::vector<IoHandle> handles;
      int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        const size_t len = 1 + rng() % (300 * 1024);
        // Offset 0 (aligned, as pinned buffers are) or 3 (misaligned, the bounce path).
        data.push_back(testing::random_bytes(len + 4096 + 3, 1000 + i));
        blocks.push_back(store.allocate(len, Category::Optimizer));
        total += static_cast<int64_t>(len);
      }
      EXPECT_EQ(stats.usage(Tier::Nvme, Category::Optimizer).current, total);
      std::vector<unsigned char*> srcs;
      for (int i = 0; i < n; ++i) {
        unsigned char* p = data[i].data();
        const size_t skew = (4096 - reinterpret_cast<uintptr_t>(p) % 4096) % 4096;
        srcs.push_back(p + (i % 3 == 0 ? skew + 3 : skew));
        handles.push_back(store.write(blocks[i], srcs[i], blocks[i].bytes));
      }
      for (auto& h : handles) h.wait();
      handles.clear();
      std::vector<std::vector<unsigned char>> back(n);
      std::vector<unsigned char*> dsts;
      for (int i = 0; i < n; ++i) {
        back[i].assign(blocks[i].bytes + 4096 + 5, 0xEE);
        unsigned char* p = back[i].data();
        const size_t skew = (4096 - reinterpret_cast<uintptr_t>(p) % 4096) % 4096;
        dsts.push_back(p + (i % 2 == 0 ? skew : skew + 5));
        handles.push_back(store.read(blocks[i], dsts[i], blocks[i].bytes));
      }
      for (int i = 0; i < n; ++i) {
        handles[i].wait();
        ASSERT_EQ(std::memcmp(srcs[i], dsts[i], blocks[i].bytes), 0) << "buffer " << i;
        EXPECT_EQ(dsts[i][blocks[i].bytes], 0xEE) << "read wrote past the end of buffer " << i;
      }
      for (auto& b : blocks) store.deallocate(b);
      EXPECT_EQ(stats.tier_usage(Tier::Nvme).current, 0);
      EXPECT_EQ(store.blocks_in_use(), 0u);
    }
  }
}

TEST_P(NvmeStoreTest, FreedBlocksAreReusedAndFilesRemoved) {
  std::vector<std::string> files;
  {
    NvmeStore store(config({a_.path()}));
    Block x = store.allocate(200 * 1024, Category::Param);  // 4 blocks
    EXPECT_EQ(store.blocks_reserved(), 4u);
    store.deallocate(x);
    Block y = store.allocate(100 * 1024, Category::Param);
    EXPECT_EQ(store.blocks_reserved(), 4u);  // no growth
    EXPECT_EQ(store.blocks_in_use(), 2u);
    store.deallocate(y);
    files = store.files();
    EXPECT_EQ(::access(files[0].c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(files[0].c_str(), F_OK), 0);  // scratch files do not outlive the store
}

INSTANTIATE_TEST_SUITE_P(Engines, NvmeStoreTest, ::testing::ValuesIn(testing::engine_kinds()),
                         testing::engine_param_name);

// --- Faults: each gives a clear error naming the path, and earlier data stays readable. ---

class NvmeFaults : public ::testing::Test {
 protected:
  // Writes n buffers of distinct random bytes and returns them.
  std::vector<std::pair<Block, std::vector<unsigned char>>> fill(NvmeStore& s, int n, size_t len) {
    std::vector<std::pair<Block, std::vector<unsigned char>>> out;
    for (int i = 0; i < n; ++i) {
      out.emplace_back(s.allocate(len, Category::Param), testing::random_bytes(len, 77 + i));
      s.write(out.back().first, out.back().second.data(), len).wait();
    }
    return out;
  }
  void expect_readable(NvmeStore& s,
                       const std::vector<std::pair<Block, std::vector<unsigned char>>>& v) {
    for (const auto& [b, bytes] : v) {
      std::vector<unsigned char> back(bytes.size());
      s.read(b, back.data(), back.size()).wait();
      EXPECT_EQ(back, bytes);
    }
  }
  TempDir dir_;
};

TEST_F(NvmeFaults, MissingPathOrNotADirectory) {
  const std::string missing = dir_.path() + "/no/such/dir";
  expect_user_error([&] { NvmeStore s(small_config({missing}, IoEngineKind::Auto)); },
                    {missing, "does not exist"});
  const std::string file = dir_.path() + "/plain";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  expect_user_error([&] { NvmeStore s(small_config({file}, IoEngineKind::Auto)); },
                    {file, "not a directory"});
  expect_user_error([&] { NvmeStore s(small_config({}, IoEngineKind::Auto)); }, {"nvme_path"});
}

TEST_F(NvmeFaults, UnwritablePath) {
  // Root ignores permission bits, so the store is opened as nobody in a child process.
  const std::string ro = dir_.path() + "/ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  auto r = testing::run_in_child([&] {
    if (::geteuid() == 0 && ::setuid(65534) != 0) return std::string("setuid failed");
    NvmeStore s(small_config({ro}, IoEngineKind::Auto));
    return std::string("opened");
  });
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find(ro), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not writable"), std::string::npos) << r.out;
  // Nothing half-made is left behind.
  EXPECT_TRUE(std::filesystem::is_empty(ro));
}

// Disk full, injected without mount: a file-size limit (SIGXFSZ ignored) makes growth fail the
// way a full disk does.
TEST_F(NvmeFaults, DiskFullByFileSizeLimit) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 3, 100 * 1024);
  struct Restore {  // the limit is process-wide: put it back whatever happens
    rlimit old{};
    void (*handler)(int) = nullptr;
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &old);
      ::signal(SIGXFSZ, handler);
    }
  } restore;
  ::getrlimit(RLIMIT_FSIZE, &restore.old);
  restore.handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit lim{1 << 20, restore.old.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  expect_user_error(
      [&] {
        for (int i = 0; i < 100; ++i) store.allocate(200 * 1024, Category::Param);
      },
      {"full", store.files()[0]});
  expect_readable(store, early);
}

// Disk full on a real, tiny filesystem (a 1 MiB tmpfs): needs mount, skipped where not allowed.
TEST_F(NvmeFaults, DiskFullOnTinyTmpfs) {
  const std::string mnt = dir_.path() + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); DiskFullByFileSizeLimit covers disk-full";
  {
    NvmeConfig c = small_config({mnt}, IoEngineKind::Auto);
    c.o_direct = ODirect::Auto;  // tmpfs may refuse O_DIRECT: the documented buffered fallback
    NvmeStore store(c);
    auto early = fill(store, 4, 128 * 1024);
    expect_user_error(
        [&] {
          for (int i = 0; i < 100; ++i) store.allocate(128 * 1024, Category::Param);
        },
        {"full", store.files()[0]});
    expect_readable(store, early);
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
}

TEST_F(NvmeFaults, WriteErrorLosesOnlyThatBuffer) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 2, 70000);
  Block victim = store.allocate(70000, Category::Grad);
  auto bytes = testing::random_bytes(70000, 3);
  store.engine().set_fault_injector(
      [](const IoOp& op, long res) { return op.write ? -ENOSPC : res; });
  expect_user_error([&] { store.write(victim, bytes.data(), bytes.size()).wait(); },
                    {store.files()[0], "disk is full"});
  store.engine().set_fault_injector(nullptr);
  std::vector<unsigned char> back(70000);
  expect_user_error([&] { store.read(victim, back.data(), back.size()).wait(); },
                    {"swap-out failed"});
  expect_readable(store, early);
}

TEST_F(NvmeFaults, ReadErrorAndShortRead) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 2, 150000);
  std::vector<unsigned char> back(150000);
  store.engine().set_fault_injector([](const IoOp& op, long res) { return op.write ? res : -EIO; });
  expect_user_error([&] { store.read(early[0].first, back.data(), back.size()).wait(); },
                    {store.files()[0], "Input/output error"});
  store.engine().set_fault_injector([](const IoOp& op, long res) { return op.write ? res : 0L; });
  expect_user_error([&] { store.read(early[1].first, back.data(), back.size()).wait(); },
                    {store.files()[0], "short read"});
  store.engine().set_fault_injector(nullptr);
  expect_readable(store, early);
}

TEST_F(NvmeFaults, TruncatedFileIsAShortRead) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 3, 64 * 1024);
  ASSERT_EQ(::truncate(store.files()[0].c_str(), 64 * 1024), 0);  // keeps only the first block
  expect_readable(store, {early[0]});
  std::vector<unsigned char> back(64 * 1024);
  expect_user_error([&] { store.read(early[2].first, back.data(), back.size()).wait(); },
                    {store.files()[0], "short read"});
}

TEST_F(NvmeFaults, CorruptedBlockFailsItsChecksum) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 2, 100000);
  // Flip one byte of the second buffer's data behind the store's back.
  const int fd = ::open(store.files()[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = 2 * 64 * 1024 + 1234;  // buffer 1 starts at block 2
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
  ::fsync(fd);
  ::close(fd);
  std::vector<unsigned char> back(100000);
  expect_user_error([&] { store.read(early[1].first, back.data(), back.size()).wait(); },
                    {"checksum mismatch", store.files()[0], "offset 131072"});
  expect_readable(store, {early[0]});
}

// Blocks are verified as their chunks land (Note [Checksums overlap the I/O]), whatever the
// chunk size: here one chunk spans four blocks, and a misaligned destination stages every byte
// through a bounce buffer first. The corrupt block is named; a clean read of the same shape works.
TEST_F(NvmeFaults, CorruptBlockNamedWhenChunksSpanBlocks) {
  NvmeConfig c = small_config({dir_.path()}, IoEngineKind::Auto);
  c.aio.block_size = 256 * 1024;
  NvmeStore store(c);
  auto early = fill(store, 1, 600000);  // ten 64 KiB blocks, the last one partial
  std::vector<unsigned char> back(600000 + 4096 + 3);
  unsigned char* misaligned = back.data() + 3;
  store.read(early[0].first, misaligned, 600000).wait();
  EXPECT_EQ(std::memcmp(misaligned, early[0].second.data(), 600000), 0);
  const int fd = ::open(store.files()[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t at = 6 * 64 * 1024 + 99;
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::fsync(fd);
  ::close(fd);
  for (unsigned char* dst : {back.data(), misaligned}) {
    IoHandle h = store.read(early[0].first, dst, 600000);
    expect_user_error([&] { h.wait(); }, {"checksum mismatch", store.files()[0], "offset 393216"});
    expect_user_error([&] { h.poll(); }, {"checksum mismatch"});
  }
}

TEST_F(NvmeFaults, FileRemovedUnderUs) {
  NvmeStore store(small_config({dir_.path()}, IoEngineKind::Auto));
  auto early = fill(store, 1, 5000);
  ASSERT_EQ(::unlink(store.files()[0].c_str()), 0);
  std::vector<unsigned char> back(5000);
  expect_user_error([&] { store.read(early[0].first, back.data(), back.size()).wait(); },
                    {store.files()[0], "removed"});
  expect_user_error([&] { store.write(early[0].first, back.data(), back.size()).wait(); },
                    {store.files()[0], "removed"});
}

}  // namespace
}  // namespace strata::offload
