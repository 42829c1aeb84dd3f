// The pipeline schedules' per-stage order of forwards and backwards (Note [Pipeline schedules],
// Note [Interleaved schedule]) against hand-written tables, and a simulation of every stage
// running its order with asynchronous sends and blocking receives: no stage ever waits forever,
// every link delivers in the order its receiver asks, and at most warm-up + 1 chunk
// activations are held.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

namespace strata::parallel {
namespace {

// "F0.1" = forward of micro-batch 0 on chunk 1; "B2.0" = backward of micro-batch 2 on chunk 0.
std::string show(const std::vector<PipelineOp>& order) {
  std::ostringstream out;
  for (size_t i = 0; i < order.size(); ++i)
    out << (i ? " " : "") << (order[i].forward ? 'F' : 'B') << order[i].micro_batch << '.'
        << order[i].chunk;
  return out.str();
}

std::string order(PipelineScheduleKind kind, int p, int v, int64_t m, int r) {
  return show(pipeline_order(kind, p, v, m, r));
}

TEST(PipelineOrder, GPipeAndOneFOneBMatchTheirTables) {
  using K = PipelineScheduleKind;
  EXPECT_EQ(order(K::GPipe, 2, 1, 3, 0), "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
  EXPECT_EQ(order(K::OneFOneB, 3, 1, 4, 0), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 B2.0 B3.0");
  EXPECT_EQ(order(K::OneFOneB, 3, 1, 4, 1), "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0");
  EXPECT_EQ(order(K::OneFOneB, 3, 1, 4, 2), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0");
  EXPECT_EQ(order(K::OneFOneB, 4, 1, 2, 0), "F0.0 F1.0 B0.0 B1.0");  // warm-up capped at m
}

// Megatron's interleaved order, written out by hand from its definition (Note [Interleaved
// schedule]): micro-batches go through a chunk in groups of p.
TEST(PipelineOrder, InterleavedMatchesTheHandWrittenTables) {
  using K = PipelineScheduleKind;
  // p 2, v 2, m 2 = p: every forward, then every backward.
  EXPECT_EQ(order(K::Interleaved, 2, 2, 2, 0), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  EXPECT_EQ(order(K::Interleaved, 2, 2, 2, 1), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // p 2, v 2, m 4: warm-up 4 on rank 0 ((p - 1) 2 + (v - 1) p), 2 on rank 1.
  EXPECT_EQ(order(K::Interleaved, 2, 2, 4, 0),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(K::Interleaved, 2, 2, 4, 1),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // p 2, v 3, m 4: warm-up 6 on rank 0, 4 on rank 1.
  EXPECT_EQ(order(K::Interleaved, 2, 3, 4, 0),
            "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.1 B0.1 F3.1 B1.1 F2.2 B0.0 "
            "F3.2 B1.0 B2.2 B3.2 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(K::Interleaved, 2, 3, 4, 1),
            "F0.0 F1.0 F0.1 F1.1 F0.2 B0.2 F1.2 B1.2 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
            "F2.2 B2.2 F3.2 B3.2 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(pipeline_warmup(K::Interleaved, 4, 2, 8, 0), 10);  // (4 - 1) 2 + (2 - 1) 4
  EXPECT_EQ(pipeline_warmup(K::Interleaved, 4, 2, 8, 3), 4);
  EXPECT_EQ(pipeline_warmup(K::Interleaved, 4, 2, 4, 3), 8);  // m == p: all m v
  // Micro-batches go through each chunk in groups of p.
  EXPECT_THROW(pipeline_order(K::Interleaved, 2, 2, 3, 0), UserError);
}

// Every stage runs its order; a forward waits for the previous virtual stage's forward of its
// micro-batch, a backward for its own forward and the next virtual stage's backward (sends never
// wait). Returns an empty
// string when every stage finishes, else what is stuck.
std::string simulate(PipelineScheduleKind kind, int p, int v, int64_t m) {
  const int S = p * v;  // virtual stages: chunk c of rank r is c p + r
  std::vector<std::vector<PipelineOp>> orders;
  for (int r = 0; r < p; ++r) orders.push_back(pipeline_order(kind, p, v, m, r));
  std::set<std::tuple<bool, int, int64_t>> done;  // (forward, virtual stage, micro-batch)
  // Per channel (from rank, to rank, forward): the messages in send order and receive order.
  std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int64_t>>> sent, received;
  std::vector<size_t> next(p, 0);
  std::vector<int> held(p, 0), peak(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < orders[r].size()) {
        const PipelineOp& op = orders[r][next[r]];
        const int g = op.chunk * p + r;
        const int from = op.forward ? g - 1 : g + 1;  // the virtual stage it receives from
        const bool receives = op.forward ? g > 0 : g < S - 1;
        if (receives && !done.count({op.forward, from, op.micro_batch})) break;
        // A backward after its own forward (else the order is wrong, not just stuck).
        if (!op.forward && !done.count({true, g, op.micro_batch})) break;
        if (receives) received[{from % p, r, op.forward}].push_back({g, op.micro_batch});
        const int to = op.forward ? g + 1 : g - 1;
        if (op.forward ? g < S - 1 : g > 0)
          sent[{r, to % p, op.forward}].push_back({to, op.micro_batch});
        done.insert({op.forward, g, op.micro_batch});
        held[r] += op.forward ? 1 : -1;
        peak[r] = std::max(peak[r], held[r]);
        ++next[r];
        progress = true;
      }
    }
  }
  std::ostringstream out;
  for (int r = 0; r < p; ++r) {
    if (next[r] < orders[r].size()) out << "rank " << r << " stuck at op " << next[r] << "; ";
    if (peak[r] > pipeline_warmup(kind, p, v, m, r) + 1)
      out << "rank " << r << " held " << peak[r] << " activations; ";
  }
  if (sent != received) out << "a link delivers out of its receiver's order; ";
  return out.str();
}

TEST(PipelineOrder, EverySchedulePassesItsLinksInOrderWithoutDeadlock) {
  using K = PipelineScheduleKind;
  for (int p : {2, 3, 4})
    for (int64_t m : {1, 2, 3, 4, 8}) {
      EXPECT_EQ(simulate(K::GPipe, p, 1, m), "") << "gpipe p " << p << " m " << m;
      EXPECT_EQ(simulate(K::OneFOneB, p, 1, m), "") << "1f1b p " << p << " m " << m;
      if (m % p != 0) continue;
      for (int v : {2, 3, 4})
        EXPECT_EQ(simulate(K::Interleaved, p, v, m), "")
            << "interleaved p " << p << " v " << v << " m " << m;
    }
}

}  // namespace
}  // namespace strata::parallel
