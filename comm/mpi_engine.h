#pragma once
// Internals of the MPI backend (mpi_communicator.cpp), in MPI builds only: the process-wide MPI
// state and the engine that runs one communicator's ops on its own thread (Note [MPI
// communication thread] in mpi_communicator.h) with the watchdog of Note [Failed ranks].
#if STRATA_HAVE_MPI
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace strata::comm::detail {

class MpiEngine;

struct MpiRuntime {
  std::mutex mu;                // guards the fields below
  bool initialized = false;     // mpi_init() ran (MPI is up, by us or someone else)
  bool we_initialized = false;  // and it was us, so mpi_finalize() finalises
  bool finalized = false;
  bool serialized = false;  // Note [MPI communication thread]: MPI_THREAD_SERIALIZED mode
  std::vector<std::weak_ptr<MpiEngine>> engines;  // live communicators, closed by mpi_finalize()
  // In serialized mode every MPI call holds this lock.
  std::mutex mpi_mu;
};

// Leaked on purpose: a comm thread stuck in MPI (Note [Failed ranks]) may outlive main().
MpiRuntime& mpi_runtime();

// Held around each MPI call in serialized mode; empty otherwise. `serialized` is set once in
// mpi_init(), before any communicator (and so any comm thread) exists.
std::unique_lock<std::mutex> mpi_lock();

std::string mpi_error_string(int rc);

// What one queued op leaves for its waiter.
struct MpiOpResult {
  std::exception_ptr error;
  // Runs once on the waiting thread after the op succeeded: copies staged host results back to
  // the GPU (Note [MPI communication thread]).
  std::function<void()> finish;
  std::once_flag finished;
};

// The queue, the comm thread and the watchdog of one communicator. Shared with the thread and
// every Work handle, so a thread left stuck in MPI keeps it alive.
class MpiEngine : public std::enable_shared_from_this<MpiEngine> {
 public:
  // `label` starts messages ("communicator 'dp' (mpi, rank 1 of 4)"); `members` ends the
  // watchdog's (" (the group holds world ranks 1, 3)" or "").
  MpiEngine(MPI_Comm comm, std::string label, std::string members,
            std::chrono::milliseconds timeout);

  // Starts the thread and registers the engine for mpi_finalize().
  void start();

  MPI_Comm comm() const { return comm_; }
  const std::string& label() const { return label_; }

  // Queues `run` (the MPI calls, run on the comm thread; throws on failure). Returns its number.
  uint64_t submit(std::string what, std::function<void()> run, std::shared_ptr<MpiOpResult> result);
  // Note [Failed ranks]: blocks until op `seq` completed, or raises once the op the thread is
  // running has run longer than the timeout (it may be an earlier op that `seq` waits behind).
  void wait(uint64_t seq);
  // A timed-out op is not done; it may still finish if the peers turn up late.
  bool done(uint64_t seq) const;
  void set_timeout(std::chrono::milliseconds t);
  // Drains the queue (each op within its timeout), stops the thread and frees the MPI
  // communicator. Returns false, leaving the thread detached in its MPI call, when an op is stuck.
  bool close();

  // Raises a UserError with MPI's message when an MPI call failed.
  void check(int rc, std::string_view what) const;

  // One MPI operation, from the comm thread (Note [MPI communication thread]): the blocking call,
  // or in serialized mode the non-blocking one, polled without holding the lock in between.
  template <typename Blocking, typename Start>
  void call(std::string_view what, Blocking&& blocking, Start&& start) {
    if (!mpi_runtime().serialized) {
      check(blocking(), what);
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    {
      auto ml = mpi_lock();
      check(start(&req), what);
    }
    poll(req, what);
  }
  // Polls `req` with MPI_Test until it completes (serialized mode).
  void poll(MPI_Request& req, std::string_view what);

 private:
  using Clock = std::chrono::steady_clock;
  struct Op {
    uint64_t seq = 0;
    std::string what;  // "allreduce of 4096 f32", for the watchdog's message
    std::function<void()> run;
    std::shared_ptr<MpiOpResult> result;
  };

  void loop();
  // With `lk` held: true once op `seq` completed; false when the watchdog fired (failure_ set).
  bool wait_completed(std::unique_lock<std::mutex>& lk, uint64_t seq);

  MPI_Comm comm_;
  const std::string label_;
  const std::string members_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_, done_cv_;
  std::deque<Op> queue_;
  uint64_t issued_ = 0, completed_ = 0;  // ops complete in issue order
  // Copies of issued_ and completed_ that the spin phases read without the lock (Note [Spin then
  // block] in mpi_engine.cpp).
  std::atomic<uint64_t> issued_seen_{0}, completed_seen_{0};
  bool running_ = false;
  std::string running_what_;
  Clock::time_point running_since_;
  std::chrono::milliseconds timeout_;
  std::string failure_;  // set once an op timed out: the communicator cannot be used any more
  bool stop_ = false, closed_ = false, close_ok_ = false;
  std::thread thread_;
};

}  // namespace strata::comm::detail

#endif  // STRATA_HAVE_MPI
