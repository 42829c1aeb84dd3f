#pragma once
// Process groups: the world split into tensor- (tp), data- (dp) and pipeline-parallel (pp) groups.
//
// Note [Process group order]
// Megatron's order: global rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank. Tensor-parallel
// peers are neighbours (tp varies fastest, so a tp group sits on one node's fast links), pipeline
// stages are furthest apart. A tp group holds the ranks with the same (dp_rank, pp_rank), a dp
// group the same (tp_rank, pp_rank), a pp group the same (tp_rank, dp_rank); within each group,
// ranks are ordered by their coordinate along it.
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace strata::comm {

// The sizes of the three dimensions; tp * dp * pp is the world size.
struct GroupLayout {
  int tp = 1, dp = 1, pp = 1;
  int world_size() const { return tp * dp * pp; }
};

// dp = world_size / (tp * pp). Raises a UserError naming the sizes when they do not divide.
GroupLayout make_group_layout(int world_size, int tp, int pp);

struct GroupCoords {
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  bool operator==(const GroupCoords&) const = default;
};

enum class GroupKind { Tp, Dp, Pp };

// Note [Process group order], both ways.
GroupCoords group_coords(const GroupLayout& layout, int rank);
int global_rank(const GroupLayout& layout, const GroupCoords& coords);
// The global ranks of `rank`'s group of the given kind, in group-rank order.
std::vector<int> group_members(const GroupLayout& layout, GroupKind kind, int rank);
// The MPI_Comm_split arguments that build that group: one color per group, key = rank within it.
int group_color(const GroupLayout& layout, GroupKind kind, int rank);
int group_key(const GroupLayout& layout, GroupKind kind, int rank);

struct ProcessGroups {
  int tp_size = 1, dp_size = 1, pp_size = 1, tp_rank = 0, dp_rank = 0, pp_rank = 0;
  std::shared_ptr<Communicator> world, tp, dp, pp;
};

// Splits `world` into the three groups (collective over `world`: every rank calls it with the same
// tp and pp). A group of one rank is a SelfCommunicator (no thread, nothing can hang). World size
// not divisible by tp * pp => UserError naming the sizes.
ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, int tp, int pp);

}  // namespace strata::comm
