// Process-group arithmetic (Note [Process group order]) and process groups over a world of one.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "comm/process_groups.h"
#include "comm/self_communicator.h"

namespace strata::comm {
namespace {

TEST(ProcessGroupArithmetic, MegatronOrderTpFastestPpSlowest) {
  // 16 ranks as tp=2, dp=4, pp=2.
  const GroupLayout l = make_group_layout(16, 2, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(group_coords(l, 0), (GroupCoords{0, 0, 0}));
  EXPECT_EQ(group_coords(l, 1), (GroupCoords{1, 0, 0}));
  EXPECT_EQ(group_coords(l, 2), (GroupCoords{0, 1, 0}));
  EXPECT_EQ(group_coords(l, 7), (GroupCoords{1, 3, 0}));
  EXPECT_EQ(group_coords(l, 8), (GroupCoords{0, 0, 1}));
  EXPECT_EQ(group_coords(l, 13), (GroupCoords{1, 2, 1}));
  for (int r = 0; r < 16; ++r) EXPECT_EQ(global_rank(l, group_coords(l, r)), r);
}

TEST(ProcessGroupArithmetic, MembersOfEachGroup) {
  // np 8, tp=2, pp=2 => dp=2, as in Megatron's docs: tp groups {0,1} {2,3} {4,5} {6,7};
  // dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5} {2,6} {3,7}.
  const GroupLayout l = make_group_layout(8, 2, 2);
  EXPECT_EQ(group_members(l, GroupKind::Tp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(group_members(l, GroupKind::Dp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(group_members(l, GroupKind::Pp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(group_members(l, GroupKind::Dp, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(group_members(l, GroupKind::Pp, 2), (std::vector<int>{2, 6}));
}

TEST(ProcessGroupArithmetic, ColorsAndKeysPartitionTheWorld) {
  for (auto [n, tp, pp] : {std::tuple{8, 2, 2}, {12, 3, 2}, {6, 1, 3}, {4, 4, 1}, {1, 1, 1}}) {
    const GroupLayout l = make_group_layout(n, tp, pp);
    for (GroupKind kind : {GroupKind::Tp, GroupKind::Dp, GroupKind::Pp}) {
      for (int r = 0; r < n; ++r) {
        const auto members = group_members(l, kind, r);
        // Exactly the ranks sharing r's color, ordered by key.
        std::vector<int> same_color;
        for (int q = 0; q < n; ++q) {
          if (group_color(l, kind, q) == group_color(l, kind, r)) same_color.push_back(q);
        }
        std::sort(same_color.begin(), same_color.end(),
                  [&](int a, int b) { return group_key(l, kind, a) < group_key(l, kind, b); });
        EXPECT_EQ(members, same_color) << "n=" << n << " tp=" << tp << " pp=" << pp;
        EXPECT_EQ(members[group_key(l, kind, r)], r);
      }
    }
  }
}

TEST(ProcessGroupArithmetic, SizesThatDoNotDivideAreUserErrors) {
  try {
    make_group_layout(6, 4, 1);
    FAIL();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("6 ranks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4 * 1"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_group_layout(8, 3, 1), UserError);
  EXPECT_THROW(make_group_layout(8, 0, 1), UserError);
  EXPECT_THROW(make_group_layout(8, 1, -2), UserError);
}

TEST(ProcessGroups, WorldOfOneGivesSelfGroups) {
  auto world = std::make_shared<SelfCommunicator>("world");
  const ProcessGroups g = make_process_groups(world, 1, 1);
  EXPECT_EQ(g.world, world);
  EXPECT_EQ(g.tp->name(), "tp");
  EXPECT_EQ(g.dp->name(), "dp");
  EXPECT_EQ(g.pp->name(), "pp");
  EXPECT_EQ(g.tp->size() * g.dp->size() * g.pp->size(), 1);
  EXPECT_THROW(make_process_groups(world, 2, 1), UserError);
}

}  // namespace
}  // namespace strata::comm
