#pragma once
// Internal to the AIO engine: one kernel submission queue, io_uring or libaio behind one face.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "offload/aio_engine.h"

namespace strata::offload {

struct AioEngine::Chunk {
  std::shared_ptr<detail::IoState> st;
  IoOp op;          // what is left to transfer
  size_t done = 0;  // bytes already transferred by short transfers before this resubmission
};

class AioEngine::Queue {
 public:
  virtual ~Queue() = default;
  // Called once on the worker thread that will own the queue, before its first prep.
  virtual void start() {}
  // Adds the chunk to the submission queue without telling the kernel.
  virtual void prep(Chunk* c) = 0;
  // Hands everything prepared to the kernel.
  virtual void submit() = 0;
  // Waits for at least `min` completions (0: takes only what is ready) and appends them.
  virtual void reap(int min, std::vector<std::pair<Chunk*, long>>& out) = 0;
};

// nullptr with the reason in *why when the kernel refuses (seccomp, old kernel, limits).
std::unique_ptr<AioEngine::Queue> make_uring_queue(int depth, std::string* why);
std::unique_ptr<AioEngine::Queue> make_libaio_queue(int depth, std::string* why);

}  // namespace strata::offload
