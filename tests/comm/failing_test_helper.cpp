// Started under mpirun by dead_rank_launch_test.cpp to check mpi_test_main.cpp: a test that
// fails on rank 1 only must stop the whole job with a non-zero exit, naming the rank.
#include <gtest/gtest.h>

#include "tests/support/mpi_test_env.h"

namespace {

TEST(MpiTestMain, FailsOnRankOneOnly) {
  EXPECT_NE(strata::testing::test_world()->rank(), 1) << "rank 1 fails on purpose";
}

TEST(MpiTestMain, NeverRunsAfterAFailure) {
  SUCCEED();
}

}  // namespace
