// GoogleTest main for multi-rank tests, run as `mpirun -np N test_binary`.
//
// Every rank runs every test. Rank 0 prints GoogleTest's usual output; the other ranks print only
// their failures, each line tagged with the rank. After each test the ranks exchange whether it
// failed anywhere, over a communicator of their own (so a test that left collectives unmatched on
// the world cannot confuse the exchange). When a test failed on any rank, the ranks' collectives
// may no longer match, so rank 0 names the test and the failing ranks and the whole job stops
// with exit code 1 (abort_world); otherwise every rank exits with 0.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/logging.h"
#include "comm/world.h"
#include "tests/support/mpi_test_env.h"

namespace strata::testing {

namespace {

std::shared_ptr<comm::Communicator> g_world;

std::chrono::milliseconds test_timeout() {
  const char* v = std::getenv("STRATA_TEST_COMM_TIMEOUT_S");
  const int s = v && *v ? std::atoi(v) : 60;
  return std::chrono::seconds(s > 0 ? s : 60);
}

// Failures of ranks other than 0, tagged with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

// After each test: did it fail on any rank? If so, name the ranks and stop the job.
class FailureExchange : public ::testing::EmptyTestEventListener {
 public:
  explicit FailureExchange(std::shared_ptr<comm::Communicator> sync) : sync_(std::move(sync)) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int n = sync_->size();
    auto flags = tensor::zeros({n}, DType::I32);
    auto mine = tensor::full({1}, info.result()->Failed() ? 1 : 0, DType::I32);
    try {
      sync_->allgather(mine, flags)->wait();
    } catch (const Error& e) {
      std::fprintf(stderr, "[rank %d] after %s.%s: %s\n", sync_->rank(), info.test_suite_name(),
                   info.name(), e.what());
      comm::abort_world(1);
    }
    std::string failed;
    const int32_t* f = flags.data<int32_t>();
    for (int r = 0; r < n; ++r) {
      if (f[r]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    }
    if (failed.empty()) return;
    if (sync_->rank() == 0) {
      std::fprintf(stderr, "[mpi_test_main] %s.%s failed on rank(s) %s; stopping all ranks\n",
                   info.test_suite_name(), info.name(), failed.c_str());
    }
    // Give the other ranks' failure messages a moment to reach mpirun before the abort.
    std::fflush(nullptr);
    sync_->barrier();
    comm::abort_world(1);
  }

 private:
  std::shared_ptr<comm::Communicator> sync_;
};

}  // namespace

std::shared_ptr<comm::Communicator> test_world() {
  return g_world;
}

namespace {

int run(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  log::set_level(spdlog::level::warn);
  std::shared_ptr<comm::Communicator> sync;
  try {
    g_world = comm::init_world("auto", Device::cpu(), test_timeout());
    sync = g_world->split(0, g_world->rank(), "test-sync");
  } catch (const Error& e) {
    std::fprintf(stderr, "mpi_test_main: %s\n", e.what());
    comm::abort_world(1);
  }
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (sync->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(sync->rank()));
  }
  listeners.Append(new FailureExchange(sync));
  const int rc = RUN_ALL_TESTS();
  // RUN_ALL_TESTS also fails on errors outside a test (e.g. a failing environment).
  auto any = tensor::full({1}, rc != 0 ? 1 : 0, DType::I32);
  try {
    sync->allreduce(any, comm::ReduceOp::Max)->wait();
  } catch (const Error& e) {
    std::fprintf(stderr, "mpi_test_main: %s\n", e.what());
    comm::abort_world(1);
  }
  const bool failed = any.data<int32_t>()[0] != 0;
  sync.reset();
  g_world.reset();
  comm::finalize_world();
  return failed ? 1 : 0;
}

}  // namespace

}  // namespace strata::testing

int main(int argc, char** argv) {
  return strata::testing::run(argc, argv);
}
