// A rank that dies or hangs mid-run makes the others exit with a clear error within 60 s, not hang
// (Note [Failed ranks]). Each test starts `mpirun -np 3` on a helper program and times it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "tests/support/tool_test_util.h"

namespace strata::comm {
namespace {

using strata::testing::CommandResult;
using strata::testing::run_command;
using strata::testing::ScratchDir;

struct Launch {
  CommandResult result;
  double seconds = 0;
  std::string output() const { return result.out + result.err; }
};

Launch mpirun(int np, const std::vector<std::string>& args) {
  // OpenMPI: root in containers, more ranks than cores, idle ranks yield the CPU.
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
  std::vector<std::string> argv = {STRATA_MPIEXEC, "-np", std::to_string(np)};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto t0 = std::chrono::steady_clock::now();
  Launch l;
  l.result = run_command(argv, std::chrono::seconds(120));
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l;
}

// Every helper rank wrote its pid; none may outlive mpirun (a stopped rank left behind would hold
// its memory and GPU forever). Kills leftovers so a failure does not leak them into other tests.
void expect_no_rank_left(const ScratchDir& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    const pid_t pid = std::stoi(strata::testing::read_text(e.path().string()));
    bool alive = true;
    for (int i = 0; i < 100 && alive; ++i) {
      alive = ::kill(pid, 0) == 0;
      if (alive) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(alive) << e.path().filename() << " (pid " << pid << ") outlived the job";
    if (alive) ::kill(pid, SIGKILL);
  }
}

std::string helper() {
  return std::string(STRATA_BINARY_DIR) + "/comm_dead_rank_helper";
}

TEST(DeadRank, HealthyRunExitsCleanly) {
  ScratchDir dir;
  const Launch l = mpirun(3, {helper(), "ok", "5000", dir.path()});
  EXPECT_EQ(l.result.exit_code, 0) << l.output();
  EXPECT_NE(l.output().find("rank 2: done"), std::string::npos) << l.output();
  expect_no_rank_left(dir);
}

TEST(DeadRank, KilledRankEndsTheJobWithinSixtySeconds) {
  ScratchDir dir;
  const Launch l = mpirun(3, {helper(), "kill", "30000", dir.path()});
  std::printf("killed rank: mpirun exited with %d after %.1f s\n", l.result.exit_code, l.seconds);
  EXPECT_NE(l.result.exit_code, 0) << l.output();
  EXPECT_NE(l.result.exit_code, -1) << "mpirun did not exit within 120 s:\n" << l.output();
  EXPECT_LT(l.seconds, 60.0);
  // OpenMPI's launcher names the dead rank and the signal; a survivor's watchdog would name the op.
  const std::string out = l.output();
  EXPECT_TRUE(out.find("signal 9") != std::string::npos ||
              out.find("did not finish within") != std::string::npos)
      << out;
  expect_no_rank_left(dir);
}

TEST(DeadRank, HungRankTripsTheWatchdogAndEndsTheJob) {
  ScratchDir dir;
  const Launch l = mpirun(3, {helper(), "stop", "5000", dir.path()});
  std::printf("stopped rank: mpirun exited with %d after %.1f s\n", l.result.exit_code, l.seconds);
  EXPECT_NE(l.result.exit_code, 0) << l.output();
  EXPECT_NE(l.result.exit_code, -1) << "mpirun did not exit within 120 s:\n" << l.output();
  EXPECT_LT(l.seconds, 60.0);
  EXPECT_GE(l.seconds, 5.0) << "the job ended before the 5 s timeout could fire";
  // Rank 1 stopped; either survivor's watchdog may fire first, and its MPI_Abort can end the
  // other before that one prints.
  const std::string out = l.output();
  bool named = false;
  for (const char* survivor : {"0", "2"})
    named |= out.find(fmt::format("(mpi, rank {} of 3): allreduce of 1024 f32 did not finish "
                                  "within 5 s; a peer rank has probably died or hangs",
                                  survivor)) != std::string::npos;
  EXPECT_TRUE(named) << out;
  expect_no_rank_left(dir);
}

TEST(MpiTestMain, AFailureOnOneRankFailsTheJobAndNamesTheRank) {
  const Launch l = mpirun(3, {std::string(STRATA_BINARY_DIR) + "/comm_failing_test_helper"});
  const std::string out = l.output();
  EXPECT_NE(l.result.exit_code, 0) << out;
  EXPECT_NE(l.result.exit_code, -1) << out;
  EXPECT_NE(out.find("[rank 1]"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 fails on purpose"), std::string::npos) << out;
  EXPECT_NE(out.find("MpiTestMain.FailsOnRankOneOnly failed on rank(s) 1"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("NeverRunsAfterAFailure"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata::comm
