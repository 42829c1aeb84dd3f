#include "comm/process_groups.h"

#include "core/error.h"
#include "comm/self_communicator.h"

namespace strata::comm {

GroupLayout make_group_layout(int world_size, int tp, int pp) {
  STRATA_USER_CHECK(tp >= 1 && pp >= 1,
                    "tensor_parallel ({}) and pipeline_parallel ({}) sizes must be at least 1", tp,
                    pp);
  STRATA_USER_CHECK(world_size % (tp * pp) == 0,
                    "the world has {} ranks, which tensor_parallel * pipeline_parallel = {} * {} = "
                    "{} does not divide; launch a multiple of {} ranks or change the sizes",
                    world_size, tp, pp, tp * pp, tp * pp);
  return GroupLayout{tp, world_size / (tp * pp), pp};
}

GroupCoords group_coords(const GroupLayout& l, int rank) {
  STRATA_CHECK(rank >= 0 && rank < l.world_size(), "rank {} outside a world of {}", rank,
               l.world_size());
  return GroupCoords{rank % l.tp, (rank / l.tp) % l.dp, rank / (l.tp * l.dp)};
}

int global_rank(const GroupLayout& l, const GroupCoords& c) {
  return c.pp_rank * (l.dp * l.tp) + c.dp_rank * l.tp + c.tp_rank;
}

int group_color(const GroupLayout& l, GroupKind kind, int rank) {
  const GroupCoords c = group_coords(l, rank);
  switch (kind) {
    case GroupKind::Tp:
      return c.pp_rank * l.dp + c.dp_rank;
    case GroupKind::Dp:
      return c.pp_rank * l.tp + c.tp_rank;
    case GroupKind::Pp:
      return c.dp_rank * l.tp + c.tp_rank;
  }
  STRATA_UNREACHABLE();
}

int group_key(const GroupLayout& l, GroupKind kind, int rank) {
  const GroupCoords c = group_coords(l, rank);
  switch (kind) {
    case GroupKind::Tp:
      return c.tp_rank;
    case GroupKind::Dp:
      return c.dp_rank;
    case GroupKind::Pp:
      return c.pp_rank;
  }
  STRATA_UNREACHABLE();
}

std::vector<int> group_members(const GroupLayout& l, GroupKind kind, int rank) {
  const GroupCoords c = group_coords(l, rank);
  const int n = kind == GroupKind::Tp ? l.tp : kind == GroupKind::Dp ? l.dp : l.pp;
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    GroupCoords m = c;
    (kind == GroupKind::Tp ? m.tp_rank : kind == GroupKind::Dp ? m.dp_rank : m.pp_rank) = i;
    out.push_back(global_rank(l, m));
  }
  return out;
}

ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, int tp, int pp) {
  STRATA_CHECK(world != nullptr, "make_process_groups needs a world communicator");
  const GroupLayout l = make_group_layout(world->size(), tp, pp);
  const GroupCoords c = group_coords(l, world->rank());
  ProcessGroups g;
  g.tp_size = l.tp;
  g.dp_size = l.dp;
  g.pp_size = l.pp;
  g.tp_rank = c.tp_rank;
  g.dp_rank = c.dp_rank;
  g.pp_rank = c.pp_rank;
  // Every rank takes the same branches (sizes are equal everywhere), so the splits match.
  auto make = [&](GroupKind kind, int n, const char* name) -> std::shared_ptr<Communicator> {
    if (n == 1) return std::make_shared<SelfCommunicator>(name);
    std::shared_ptr<Communicator> comm =
        world->split(group_color(l, kind, world->rank()), group_key(l, kind, world->rank()), name);
    STRATA_CHECK(comm && comm->size() == n, "group '{}' has {} ranks, expected {}", name,
                 comm ? comm->size() : 0, n);
    return comm;
  };
  g.tp = make(GroupKind::Tp, l.tp, "tp");
  g.dp = make(GroupKind::Dp, l.dp, "dp");
  g.pp = make(GroupKind::Pp, l.pp, "pp");
  g.world = std::move(world);
  return g;
}

}  // namespace strata::comm
