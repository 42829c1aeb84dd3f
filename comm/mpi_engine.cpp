#include "comm/mpi_engine.h"

#if STRATA_HAVE_MPI
#include "core/error.h"
#include "core/logging.h"
#include "comm/comm_common.h"

namespace strata::comm::detail {

// Note [Spin then block]
// Handing an op to the comm thread and its completion back costs two thread wake-ups through a
// condition variable, tens of microseconds on a loaded machine: more than a small allreduce itself.
// So both sides first spin for a short while (yielding the CPU each turn) on lock-free copies of
// the counters, and only then sleep on the condition variable: the comm thread right after an op
// (the next one is often issued at once), the waiter before blocking. The spins are bounded by
// kSpin, so an idle communicator costs no CPU. `bench_comm` measures small collectives against
// raw MPI calls.
namespace {
constexpr auto kSpin = std::chrono::microseconds(50);

template <typename Ready>
bool spin_until(Ready&& ready) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
}
}  // namespace

MpiRuntime& mpi_runtime() {
  static auto* rt = new MpiRuntime;
  return *rt;
}

std::unique_lock<std::mutex> mpi_lock() {
  auto& rt = mpi_runtime();
  return rt.serialized ? std::unique_lock<std::mutex>(rt.mpi_mu) : std::unique_lock<std::mutex>();
}

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

MpiEngine::MpiEngine(MPI_Comm comm, std::string label, std::string members,
                     std::chrono::milliseconds timeout)
    : comm_(comm), label_(std::move(label)), members_(std::move(members)), timeout_(timeout) {}

void MpiEngine::start() {
  thread_ = std::thread([self = shared_from_this()] { self->loop(); });
  auto& rt = mpi_runtime();
  std::lock_guard lk(rt.mu);
  std::erase_if(rt.engines, [](const auto& w) { return w.expired(); });
  rt.engines.push_back(weak_from_this());
}

uint64_t MpiEngine::submit(std::string what, std::function<void()> run,
                           std::shared_ptr<MpiOpResult> result) {
  std::lock_guard lk(mu_);
  STRATA_USER_CHECK(!closed_,
                    "{}: {} issued after the communicator was closed (finalize_world() closes "
                    "every MPI communicator)",
                    label_, what);
  STRATA_USER_CHECK(failure_.empty(), "{}: {} issued after an earlier failure: {}", label_, what,
                    failure_);
  const uint64_t seq = ++issued_;
  queue_.push_back(Op{seq, std::move(what), std::move(run), std::move(result)});
  issued_seen_.store(seq, std::memory_order_release);
  work_cv_.notify_one();
  return seq;
}

void MpiEngine::wait(uint64_t seq) {
  spin_until([&] { return completed_seen_.load(std::memory_order_acquire) >= seq; });
  std::unique_lock lk(mu_);
  if (!wait_completed(lk, seq)) throw UserError(failure_);
}

bool MpiEngine::done(uint64_t seq) const {
  std::lock_guard lk(mu_);
  return completed_ >= seq;
}

void MpiEngine::set_timeout(std::chrono::milliseconds t) {
  std::lock_guard lk(mu_);
  timeout_ = t;
  done_cv_.notify_all();
}

bool MpiEngine::close() {
  std::unique_lock lk(mu_);
  if (closed_) return close_ok_;
  closed_ = true;
  stop_ = true;
  work_cv_.notify_all();
  close_ok_ = wait_completed(lk, issued_);
  lk.unlock();
  if (!close_ok_) {
    log::error("{}", failure_);
    thread_.detach();
    return false;
  }
  thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    auto ml = mpi_lock();
    MPI_Comm_free(&comm_);
  }
  return true;
}

void MpiEngine::check(int rc, std::string_view what) const {
  if (rc != MPI_SUCCESS) user_error("{}: {} failed: {}", label_, what, mpi_error_string(rc));
}

void MpiEngine::poll(MPI_Request& req, std::string_view what) {
  for (int spins = 0;; ++spins) {
    int flag = 0;
    {
      auto ml = mpi_lock();
      check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what);
    }
    if (flag) return;
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void MpiEngine::loop() {
  uint64_t taken = 0;
  for (;;) {
    Op op;
    spin_until([&] { return issued_seen_.load(std::memory_order_acquire) > taken; });
    {
      std::unique_lock lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      taken = op.seq;
      running_ = true;
      running_what_ = op.what;
      running_since_ = Clock::now();
    }
    std::exception_ptr error;
    try {
      op.run();
    } catch (...) {
      error = std::current_exception();
    }
    // Drop the op's tensors (and temporaries) before the waiter hears it finished, so memory
    // accounting read right after wait() does not still count them.
    op.run = nullptr;
    {
      std::lock_guard lk(mu_);
      op.result->error = error;
      running_ = false;
      completed_ = op.seq;
      completed_seen_.store(op.seq, std::memory_order_release);
    }
    done_cv_.notify_all();
  }
}

bool MpiEngine::wait_completed(std::unique_lock<std::mutex>& lk, uint64_t seq) {
  while (completed_ < seq) {
    if (!failure_.empty()) return false;
    const auto now = Clock::now();
    if (running_ && now - running_since_ >= timeout_) {
      failure_ =
          fmt::format("{}: {} did not finish within {}; a peer rank has probably died or hangs{}",
                      label_, running_what_, format_duration(timeout_), members_);
      done_cv_.notify_all();
      return false;
    }
    // Not yet running: it starts at the earliest now, so its deadline is no earlier than this.
    done_cv_.wait_until(lk, running_ ? running_since_ + timeout_ : now + timeout_);
  }
  return true;
}

}  // namespace strata::comm::detail

#endif  // STRATA_HAVE_MPI
