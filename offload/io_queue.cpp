#include "offload/io_queue.h"

#include <libaio.h>
#include <liburing.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace strata::offload {
namespace {

class UringQueue final : public AioEngine::Queue {
 public:
  UringQueue(io_uring ring, bool disabled) : ring_(ring), disabled_(disabled) {}
  ~UringQueue() override { io_uring_queue_exit(&ring_); }

  void start() override {
    if (!disabled_) return;
    // The ring's single issuer is the task that enables it: this worker thread.
    // io_uring_enable_rings is declared by liburing 2.3's header but not exported by its library.
    const long r =
        ::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0);
    STRATA_CHECK(r == 0, "enabling an io_uring ring failed: {}", std::strerror(errno));
    disabled_ = false;
  }

  void prep(AioEngine::Chunk* c) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // never more prepared than the depth, but be safe: flush first
      submit();
      sqe = io_uring_get_sqe(&ring_);
    }
    STRATA_CHECK(sqe != nullptr, "io_uring submission queue full");
    const auto len = static_cast<unsigned>(c->op.len);
    if (c->op.write)
      io_uring_prep_write(sqe, c->op.fd, c->op.buf, len, c->op.offset);
    else
      io_uring_prep_read(sqe, c->op.fd, c->op.buf, len, c->op.offset);
    io_uring_sqe_set_data(sqe, c);
  }

  void submit() override {
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0 || (r != -EINTR && r != -EAGAIN && r != -EBUSY)) {
        STRATA_CHECK(r >= 0, "io_uring_submit failed: {}", std::strerror(-r));
        return;
      }
    }
  }

  void reap(int min, std::vector<std::pair<AioEngine::Chunk*, long>>& out) override {
    int got = 0;
    while (got < min) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      STRATA_CHECK(r == 0, "io_uring_wait_cqe failed: {}", std::strerror(-r));
      got += take_ready(out);
    }
    if (min == 0) take_ready(out);
  }

 private:
  int take_ready(std::vector<std::pair<AioEngine::Chunk*, long>>& out) {
    int n = 0;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      out.emplace_back(static_cast<AioEngine::Chunk*>(io_uring_cqe_get_data(cqe)), cqe->res);
      io_uring_cqe_seen(&ring_, cqe);
      ++n;
    }
    return n;
  }

  io_uring ring_;
  bool disabled_;
};

class LibaioQueue final : public AioEngine::Queue {
 public:
  LibaioQueue(io_context_t ctx, int depth) : ctx_(ctx), iocbs_(depth), events_(depth) {
    for (auto& cb : iocbs_) free_.push_back(&cb);
  }
  ~LibaioQueue() override { io_destroy(ctx_); }

  void prep(AioEngine::Chunk* c) override {
    STRATA_CHECK(!free_.empty(), "libaio queue full");
    iocb* cb = free_.back();
    free_.pop_back();
    if (c->op.write)
      io_prep_pwrite(cb, c->op.fd, c->op.buf, c->op.len, static_cast<long long>(c->op.offset));
    else
      io_prep_pread(cb, c->op.fd, c->op.buf, c->op.len, static_cast<long long>(c->op.offset));
    cb->data = c;
    prepared_.push_back(cb);
  }

  void submit() override {
    size_t done = 0;
    while (done < prepared_.size()) {
      const int r = io_submit(ctx_, static_cast<long>(prepared_.size() - done), &prepared_[done]);
      if (r == -EINTR || r == -EAGAIN) continue;
      STRATA_CHECK(r > 0, "io_submit failed: {}", std::strerror(-r));
      done += static_cast<size_t>(r);
    }
    prepared_.clear();
  }

  void reap(int min, std::vector<std::pair<AioEngine::Chunk*, long>>& out) override {
    int got = 0;
    do {
      const int r = io_getevents(ctx_, min > got ? min - got : 0, static_cast<long>(events_.size()),
                                 events_.data(), nullptr);
      if (r == -EINTR) continue;
      STRATA_CHECK(r >= 0, "io_getevents failed: {}", std::strerror(-r));
      for (int i = 0; i < r; ++i) {
        iocb* cb = events_[i].obj;
        out.emplace_back(static_cast<AioEngine::Chunk*>(cb->data),
                         static_cast<long>(events_[i].res));
        free_.push_back(cb);
      }
      got += r;
    } while (got < min);
  }

 private:
  io_context_t ctx_;
  std::vector<iocb> iocbs_;
  std::vector<io_event> events_;
  std::vector<iocb*> free_;
  std::vector<iocb*> prepared_;
};

}  // namespace

// Note [io_uring setup flags]
// Each ring has exactly one thread submitting to and reaping from it (its worker), so it is set
// up as fio and other single-threaded rings are: SINGLE_ISSUER lets the kernel skip locking,
// DEFER_TASKRUN runs completion work in batches when the worker waits instead of interrupting it
// for each one, COOP_TASKRUN avoids an IPI per completion. SINGLE_ISSUER binds the ring to the
// task that enables it, so the ring is created disabled here and enabled by its worker
// (Queue::start). Kernels before 6.1 reject the newer flags with EINVAL; each step back drops
// some, down to a plain ring.
std::unique_ptr<AioEngine::Queue> make_uring_queue(int depth, std::string* why) {
  const unsigned tries[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                IORING_SETUP_COOP_TASKRUN | IORING_SETUP_R_DISABLED,
                            IORING_SETUP_COOP_TASKRUN, 0};
  int r = -EINVAL;
  for (unsigned flags : tries) {
    io_uring ring;
    io_uring_params params{};
    params.flags = flags;
    r = io_uring_queue_init_params(static_cast<unsigned>(depth), &ring, &params);
    if (r == 0) return std::make_unique<UringQueue>(ring, (flags & IORING_SETUP_R_DISABLED) != 0);
    if (r != -EINVAL) break;
  }
  if (why) *why = fmt::format("io_uring_queue_init: {}", std::strerror(-r));
  return nullptr;
}

std::unique_ptr<AioEngine::Queue> make_libaio_queue(int depth, std::string* why) {
  io_context_t ctx = nullptr;
  const int r = io_setup(depth, &ctx);
  if (r < 0) {
    if (why) *why = fmt::format("io_setup: {}", std::strerror(-r));
    return nullptr;
  }
  return std::make_unique<LibaioQueue>(ctx, depth);
}

}  // namespace strata::offload
