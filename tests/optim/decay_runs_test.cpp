#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "optim/optimizer.h"

namespace strata::optim {
namespace {

std::string error_of(const std::vector<Segment>& segments, int64_t numel) {
  try {
    decay_runs(segments, numel, "nvme slice 2");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(DecayRuns, CoverTheBufferInOffsetOrderWithGapsDecayFree) {
  // [0,4) "w" decays, [4,6) "b" does not, [6,8) padding, [8,10) "w2" and [10,12) "w3" decay,
  // [12,16) tail padding; given out of order.
  const std::vector<DecayRun> runs = decay_runs(
      {{"w3", 10, 2, true}, {"w2", 8, 2, true}, {"w", 0, 4, true}, {"b", 4, 2, false}}, 16, "g");
  ASSERT_EQ(runs.size(), 4u);
  const int64_t want[4][3] = {{0, 4, 1}, {4, 4, 0}, {8, 4, 1}, {12, 4, 0}};
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].offset, want[i][0]) << i;
    EXPECT_EQ(runs[i].numel, want[i][1]) << i;
    EXPECT_EQ(runs[i].decay, want[i][2] != 0) << i;
  }
}

TEST(DecayRuns, NoSegmentsIsOneDecayFreeRunAndAnEmptyBufferNone) {
  const std::vector<DecayRun> runs = decay_runs({}, 5, "g");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].offset, 0);
  EXPECT_EQ(runs[0].numel, 5);
  EXPECT_FALSE(runs[0].decay);
  EXPECT_TRUE(decay_runs({}, 0, "g").empty());
}

TEST(DecayRuns, OverlapAndOutOfBoundsNameTheOwnerAndTheSegments) {
  EXPECT_EQ(error_of({{"b", 4, 4, false}, {"a", 0, 5, true}}, 8),
            "nvme slice 2: segments 'a' and 'b' overlap");
  EXPECT_EQ(error_of({{"a", 4, 5, true}}, 8),
            "nvme slice 2: segment 'a' [4, 9) lies outside the 8-element buffer");
  EXPECT_EQ(error_of({{"a", -1, 2, true}}, 8),
            "nvme slice 2: segment 'a' [-1, 1) lies outside the 8-element buffer");
}

}  // namespace
}  // namespace strata::optim
