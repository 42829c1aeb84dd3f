#include "offload/io_queue.h"

#include <libaio.h>
#include <liburing.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace strata::offload {
namespace {

class UringQueue final : public AioEngine::Queue {
 public:
  explicit UringQueue(io_uring ring) : ring_(ring) {}
  ~UringQueue() override { io_uring_queue_exit(&ring_); }

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

std::unique_ptr<AioEngine::Queue> make_uring_queue(int depth, std::string* why) {
  io_uring ring;
  const int r = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0);
  if (r < 0) {
    if (why) *why = fmt::format("io_uring_queue_init: {}", std::strerror(-r));
    return nullptr;
  }
  return std::make_unique<UringQueue>(ring);
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
