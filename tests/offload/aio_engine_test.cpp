#include "offload/aio_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "offload_test_util.h"

namespace strata::offload {
namespace {

using testing::TempDir;

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<char*>(std::aligned_alloc(4096, n))), n(n) {}
  ~AlignedBuf() { std::free(p); }
  char* p;
  size_t n;
};

class AioEngineTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    STRATA_SKIP_IF_NO_ENGINE(GetParam());
    path_ = dir_.path() + "/data.bin";
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT, 0600);  // no O_DIRECT here
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }
  AioConfig config() const {
    AioConfig c;
    c.engine = GetParam();
    c.block_size = 64 * 1024;
    c.queue_depth = 4;
    return c;
  }
  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

// Many requests of random page-multiple sizes in flight at once, under each aio setting.
TEST_P(AioEngineTest, ManyInFlightRoundTripBitExact) {
  struct Setting {
    bool single_submit, overlap;
    int threads;
  };
  for (Setting s : {Setting{false, true, 1}, Setting{true, true, 2}, Setting{false, false, 2}}) {
    AioConfig c = config();
    c.single_submit = s.single_submit;
    c.overlap_events = s.overlap;
    c.intra_op_parallelism = s.threads;
    AioEngine engine(c);
    EXPECT_EQ(engine.kind(), GetParam());
    std::mt19937_64 rng(42);
    const int n = 24;
    std::vector<std::unique_ptr<AlignedBuf>> src, dst;
    std::vector<IoHandle> handles;
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (int i = 0; i < n; ++i) {
      const size_t len = 4096 * (1 + rng() % 40);  // up to 160 KiB: spans several chunks
      src.push_back(std::make_unique<AlignedBuf>(len));
      auto bytes = testing::random_bytes(len, 100 + i);
      std::memcpy(src.back()->p, bytes.data(), len);
      IoOp op{fd_, true, src.back()->p, len, offset, path_};
      handles.push_back(engine.submit({&op, 1}));
      offsets.push_back(offset);
      offset += len;
    }
    for (auto& h : handles) h.wait();
    handles.clear();
    for (int i = 0; i < n; ++i) {
      dst.push_back(std::make_unique<AlignedBuf>(src[i]->n));
      IoOp op{fd_, false, dst.back()->p, src[i]->n, offsets[i], path_};
      handles.push_back(engine.submit({&op, 1}));
    }
    for (int i = n - 1; i >= 0; --i) {
      handles[i].wait();
      EXPECT_TRUE(handles[i].poll());
      EXPECT_EQ(handles[i].bytes(), src[i]->n);
      EXPECT_EQ(std::memcmp(src[i]->p, dst[i]->p, src[i]->n), 0) << "request " << i;
    }
  }
}

TEST_P(AioEngineTest, IoErrorNamesThePathAndLaterIoStillWorks) {
  AioEngine engine(config());
  AlignedBuf a(8192), b(8192);
  std::memset(a.p, 0x5a, 8192);
  IoOp w{fd_, true, a.p, 8192, 0, path_};
  engine.submit({&w, 1}).wait();
  engine.set_fault_injector([](const IoOp& op, long res) { return op.write ? res : -EIO; });
  IoOp r{fd_, false, b.p, 8192, 0, path_};
  IoHandle h = engine.submit({&r, 1});
  try {
    h.wait();
    FAIL() << "expected an I/O error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
  }
  EXPECT_THROW(h.poll(), UserError);  // the error stays with the handle
  engine.set_fault_injector(nullptr);
  engine.submit({&r, 1}).wait();
  EXPECT_EQ(std::memcmp(a.p, b.p, 8192), 0);
}

TEST_P(AioEngineTest, ShortTransfersAreResumedAndZeroIsAnError) {
  AioEngine engine(config());
  AlignedBuf a(64 * 1024), b(64 * 1024);
  auto bytes = testing::random_bytes(a.n, 9);
  std::memcpy(a.p, bytes.data(), a.n);
  // Every first attempt transfers only half (a page multiple): the remainder is resubmitted.
  std::atomic<int> calls{0};
  engine.set_fault_injector([&](const IoOp& op, long res) {
    if (calls++ % 2 == 0 && res > 8192) {
      if (op.write) return res;  // a real short write cannot be faked after the fact
      return static_cast<long>(op.len / 2 / 4096 * 4096);
    }
    return res;
  });
  IoOp w{fd_, true, a.p, a.n, 0, path_};
  engine.submit({&w, 1}).wait();
  IoOp r{fd_, false, b.p, b.n, 0, path_};
  engine.submit({&r, 1}).wait();
  EXPECT_EQ(std::memcmp(a.p, b.p, a.n), 0);
  // Reading past the end of the file gives 0 bytes: a short read, named.
  engine.set_fault_injector(nullptr);
  IoOp past{fd_, false, b.p, 4096, 1 << 20, path_};
  try {
    engine.submit({&past, 1}).wait();
    FAIL() << "expected a short read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("short read"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
}

// The chunk hook sees every chunk of a request once, as it was cut (positions carried from the
// op, short transfers folded back), with its data landed, before the request completes; a hook
// that throws fails the request with its message.
TEST_P(AioEngineTest, ChunkHookSeesEveryChunkOnceBeforeCompletion) {
  AioConfig c = config();
  c.intra_op_parallelism = 2;
  AioEngine engine(c);
  AlignedBuf a(256 * 1024), b(256 * 1024);
  auto bytes = testing::random_bytes(a.n, 11);
  std::memcpy(a.p, bytes.data(), a.n);
  IoOp w{fd_, true, a.p, a.n, 0, path_};
  engine.submit({&w, 1}).wait();
  std::atomic<int> calls{0};
  engine.set_fault_injector([&](const IoOp& op, long res) {
    if (calls++ % 3 == 0 && res > 8192) return static_cast<long>(op.len / 2 / 4096 * 4096);
    return res;
  });
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> seen;  // pos, len
  bool data_ok = true;
  // Two ops of one request: the hook's pos is the caller's, not the offset in the file.
  IoOp r[2] = {{fd_, false, b.p, 96 * 1024, 0, path_, 1000},
               {fd_, false, b.p + 96 * 1024, 160 * 1024, 96 * 1024, path_, 1000 + 96 * 1024}};
  IoHandle h = engine.submit({r, 2}, {}, {}, [&](const IoOp& chunk) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(chunk.pos, chunk.len);
    const size_t at = static_cast<char*>(chunk.buf) - b.p;
    EXPECT_EQ(chunk.pos, 1000 + at);
    EXPECT_EQ(chunk.offset, at);
    data_ok = data_ok && std::memcmp(a.p + at, b.p + at, chunk.len) == 0;
  });
  h.wait();
  std::sort(seen.begin(), seen.end());
  size_t next = 1000;
  for (auto [pos, len] : seen) {
    EXPECT_EQ(pos, next);
    EXPECT_LE(len, c.block_size);
    next = pos + len;
  }
  EXPECT_EQ(next, 1000 + b.n);
  EXPECT_TRUE(data_ok);
  engine.set_fault_injector(nullptr);
  IoHandle bad = engine.submit({r, 1}, {}, {}, [](const IoOp& chunk) {
    if (chunk.pos > 1000) user_error("chunk at {} rejected", chunk.pos);
  });
  try {
    bad.wait();
    FAIL() << "expected the hook's error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rejected"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bad.poll(), UserError);
}

INSTANTIATE_TEST_SUITE_P(Engines, AioEngineTest, ::testing::ValuesIn(testing::engine_kinds()),
                         testing::engine_param_name);

TEST(AioConfig, BadValuesNameTheKey) {
  AioConfig c;
  c.block_size = 1000;
  try {
    c.validate();
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("aio.block_size"), std::string::npos);
  }
  c = AioConfig{};
  c.queue_depth = 0;
  EXPECT_THROW(c.validate(), UserError);
}

}  // namespace
}  // namespace strata::offload
