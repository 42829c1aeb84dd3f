// Communicator ops across ranks, with known values: run under mpirun for several world sizes
// (tests/CMakeLists.txt), and alone (a world of one).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "core/error.h"
#include "comm/nccl_communicator.h"
#include "comm/process_groups.h"
#include "comm/world.h"
#include "tensor/cuda.h"
#include "tensor/tensor.h"
#include "tests/support/mpi_test_env.h"

namespace strata::comm {
namespace {

using tensor::Tensor;

std::shared_ptr<Communicator> world() {
  return strata::testing::test_world();
}

// Rank-dependent integer values, exact in every dtype tested (all below 2^24).
Tensor ints(const std::vector<int64_t>& v, DType dtype) {
  return tensor::from_ints(v, {static_cast<int64_t>(v.size())}, dtype);
}

std::vector<int64_t> values(const Tensor& t) {
  return tensor::to_int_vector(t);
}

const DType kReducible[] = {DType::F32, DType::I32, DType::I64};
const DType kMovable[] = {DType::F32, DType::I32, DType::I64, DType::BF16, DType::F16, DType::U8};

TEST(CommMpi, WorldMatchesTheLauncher) {
  const LaunchInfo launch = detect_launch();
  EXPECT_EQ(world()->size(), launch.size);
  EXPECT_EQ(world()->rank(), launch.rank);
  EXPECT_EQ(world()->backend(), launch.size > 1             ? "mpi"
                                : launch.launcher == "none" ? "self"
                                                            : "mpi");
  EXPECT_EQ(world()->name(), "world");
  // Idempotent: the same world again.
  EXPECT_EQ(init_world("auto", Device::cpu(), std::chrono::seconds(60)), world());
}

TEST(CommMpi, AllreduceSumEveryDtype) {
  const int n = world()->size(), r = world()->rank();
  for (DType d : kReducible) {
    for (int64_t len : {1, 37, 4096}) {
      std::vector<int64_t> v(len);
      for (int64_t i = 0; i < len; ++i) v[i] = r * 100 + i;
      Tensor t = ints(v, d);
      world()->allreduce(t)->wait();
      const auto got = values(t);
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(got[i], 100 * (n * (n - 1) / 2) + n * i) << dtype_name(d) << " i=" << i;
      }
    }
  }
}

TEST(CommMpi, AllreduceMaxAndMin) {
  const int n = world()->size(), r = world()->rank();
  auto value = [](int rank, int64_t i) { return (i * 7 + rank * 13) % 17 - 8; };
  for (DType d : {DType::F32, DType::I32, DType::I64, DType::BF16, DType::F16}) {
    std::vector<int64_t> v(50);
    for (int64_t i = 0; i < 50; ++i) v[i] = value(r, i);
    Tensor mx = ints(v, d), mn = ints(v, d);
    auto w1 = world()->allreduce(mx, ReduceOp::Max);
    auto w2 = world()->allreduce(mn, ReduceOp::Min);
    w2->wait();
    w1->wait();
    const auto gmx = values(mx), gmn = values(mn);
    for (int64_t i = 0; i < 50; ++i) {
      int64_t emx = value(0, i), emn = value(0, i);
      for (int k = 1; k < n; ++k) {
        emx = std::max(emx, value(k, i));
        emn = std::min(emn, value(k, i));
      }
      ASSERT_EQ(gmx[i], emx) << dtype_name(d);
      ASSERT_EQ(gmn[i], emn) << dtype_name(d);
    }
  }
}

// Note [Half-precision MPI reductions]: bf16/f16 sums through MPI's user-defined ops. Small
// integers are exact in both, so the sums must be too; a sum that needs rounding rounds to
// nearest even once per combination, and repeats bit for bit.
TEST(CommMpi, HalfPrecisionSums) {
  const int n = world()->size(), r = world()->rank();
  for (DType d : {DType::BF16, DType::F16}) {
    for (int64_t len : {1, 37, 3000}) {
      std::vector<int64_t> v(len);
      for (int64_t i = 0; i < len; ++i) v[i] = r + i % 9;
      Tensor t = ints(v, d);
      world()->allreduce(t)->wait();
      const auto got = values(t);
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(got[i], n * (n - 1) / 2 + n * (i % 9)) << dtype_name(d) << " i=" << i;
      std::vector<int64_t> w(n * len);
      for (int64_t j = 0; j < n * len; ++j) w[j] = r + j % 7;
      Tensor out = tensor::zeros({len}, d);
      world()->reduce_scatter(ints(w, d), out)->wait();
      const auto rs = values(out);
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(rs[i], n * (n - 1) / 2 + n * ((r * len + i) % 7)) << dtype_name(d);
    }
    // 1/3 is inexact in both: every rank gets the same bits, twice.
    Tensor a = tensor::full({64}, 1.0 / 3.0, d), b = tensor::full({64}, 1.0 / 3.0, d);
    world()->allreduce(a)->wait();
    world()->allreduce(b)->wait();
    EXPECT_EQ(tensor::to_float_vector(a), tensor::to_float_vector(b));
    const float sum = tensor::to_float_vector(a)[0];
    EXPECT_NEAR(sum, n / 3.0, n * (d == DType::BF16 ? 1.0 / 64 : 1.0 / 512)) << dtype_name(d);
    Tensor gathered = tensor::zeros({64 * n}, d);
    world()->allgather(a, gathered)->wait();
    for (float x : tensor::to_float_vector(gathered)) ASSERT_EQ(x, sum) << "ranks disagree";
  }
}

TEST(CommMpi, ReduceScatterUnevenChunkSizes) {
  const int n = world()->size(), r = world()->rank();
  for (DType d : kReducible) {
    for (int64_t k : {1, 5, 1000}) {
      std::vector<int64_t> v(n * k);
      for (int64_t j = 0; j < n * k; ++j) v[j] = r + 3 * j;
      Tensor out = tensor::zeros({k}, d);
      world()->reduce_scatter(ints(v, d), out)->wait();
      const auto got = values(out);
      for (int64_t i = 0; i < k; ++i) {
        // sum over ranks q of (q + 3 * (r * k + i))
        ASSERT_EQ(got[i], n * (n - 1) / 2 + n * 3 * (r * k + i)) << dtype_name(d) << " k=" << k;
      }
    }
  }
}

TEST(CommMpi, ReduceScatterIntoOwnChunkOfTheInput) {
  // ZeRO's case: this rank's shard of a flat gradient receives the reduced shard.
  const int n = world()->size(), r = world()->rank();
  const int64_t k = 33;
  std::vector<int64_t> v(n * k);
  for (int64_t j = 0; j < n * k; ++j) v[j] = j * (r + 1);
  Tensor flat = ints(v, DType::F32);
  Tensor shard = flat.narrow(0, r * k, k);
  world()->reduce_scatter(flat, shard, ReduceOp::Sum)->wait();
  const auto got = values(shard);
  for (int64_t i = 0; i < k; ++i) ASSERT_EQ(got[i], (r * k + i) * (n * (n + 1) / 2));
}

TEST(CommMpi, AllgatherEveryDtypeAndInPlace) {
  const int n = world()->size(), r = world()->rank();
  for (DType d : kMovable) {
    for (int64_t k : {1, 7, 3000}) {
      std::vector<int64_t> v(k);
      for (int64_t i = 0; i < k; ++i) v[i] = (r * 31 + i) % 200;  // fits u8, exact in bf16
      Tensor out = tensor::zeros({n * k}, d);
      world()->allgather(ints(v, d), out)->wait();
      auto got = values(out);
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < k; ++i) {
          ASSERT_EQ(got[q * k + i], (q * 31 + i) % 200) << dtype_name(d) << " k=" << k;
        }
      }
      // In place: the input is this rank's chunk of the output.
      Tensor whole = tensor::zeros({n * k}, d);
      Tensor mine = whole.narrow(0, r * k, k);
      mine.copy_(ints(v, d));
      world()->allgather(mine, whole)->wait();
      EXPECT_EQ(values(whole), got) << dtype_name(d);
    }
  }
}

TEST(CommMpi, BroadcastFromEveryRoot) {
  const int n = world()->size(), r = world()->rank();
  for (DType d : kMovable) {
    for (int root = 0; root < n; ++root) {
      std::vector<int64_t> v(100);
      for (int64_t i = 0; i < 100; ++i) v[i] = (r == root ? 50 + root + i : 0);
      Tensor t = ints(v, d);
      world()->broadcast(t, root)->wait();
      const auto got = values(t);
      for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(got[i], 50 + root + i) << dtype_name(d);
    }
  }
}

TEST(CommMpi, SendRecvAroundARing) {
  const int n = world()->size(), r = world()->rank();
  if (n == 1) GTEST_SKIP() << "no peer in a world of one";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Large enough for MPI's rendezvous protocol. Ops run one at a time (Note [Collective order]),
  // so even ranks send first and odd ranks receive first.
  const int64_t len = 1 << 20;
  Tensor out = tensor::full({len}, r + 1, DType::F32);
  Tensor in = tensor::zeros({len}, DType::F32);
  WorkHandle a, b;
  if (r % 2 == 0) {
    a = world()->send(out, next, 7);
    b = world()->recv(in, prev, 7);
  } else {
    b = world()->recv(in, prev, 7);
    a = world()->send(out, next, 7);
  }
  b->wait();
  a->wait();
  const auto got = tensor::to_float_vector(in);
  EXPECT_EQ(got.front(), prev + 1);
  EXPECT_EQ(got.back(), prev + 1);
}

TEST(CommMpi, ManyOpsInFlightWaitedInReverseOrder) {
  const int n = world()->size();
  std::vector<Tensor> ts;
  std::vector<WorkHandle> ws;
  for (int k = 0; k < 24; ++k) {
    ts.push_back(tensor::full({1000 + k}, k + world()->rank(), DType::F32));
    ws.push_back(world()->allreduce(ts.back()));
  }
  for (int k = 23; k >= 0; --k) {
    ws[k]->wait();
    EXPECT_TRUE(ws[k]->done());
  }
  for (int k = 0; k < 24; ++k) {
    const auto got = tensor::to_float_vector(ts[k]);
    EXPECT_EQ(got.front(), n * k + n * (n - 1) / 2);
    EXPECT_EQ(got.back(), n * k + n * (n - 1) / 2);
  }
}

TEST(CommMpi, FloatSumsAreBitwiseRepeatableAndEqualOnEveryRank) {
  const int n = world()->size(), r = world()->rank();
  for (int64_t len : {3, 1000, 1 << 18}) {
    Tensor x = tensor::randn({len}, RngKey{1234, static_cast<uint64_t>(r)});
    Tensor a = x.clone(), b = x.clone();
    world()->allreduce(a)->wait();
    world()->allreduce(b)->wait();
    ASSERT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << "len " << len;
    Tensor all = tensor::zeros({n * len}, DType::F32);
    world()->allgather(a, all)->wait();
    for (int q = 0; q < n; ++q) {
      ASSERT_EQ(std::memcmp(all.narrow(0, q * len, len).data_ptr(), a.data_ptr(), a.nbytes()), 0)
          << "rank " << q << " differs, len " << len;
    }
  }
}

TEST(CommMpi, ProcessGroupsHoldTheMegatronMembers) {
  const int n = world()->size(), r = world()->rank();
  for (auto [tp, pp] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {n, 1}, {1, n}}) {
    if (n % (tp * pp) != 0) {
      EXPECT_THROW(make_process_groups(world(), tp, pp), UserError);
      continue;
    }
    const ProcessGroups g = make_process_groups(world(), tp, pp);
    const GroupLayout l = make_group_layout(n, tp, pp);
    EXPECT_EQ(g.tp_size * g.dp_size * g.pp_size, n);
    EXPECT_EQ(global_rank(l, {g.tp_rank, g.dp_rank, g.pp_rank}), r);
    const std::pair<GroupKind, std::shared_ptr<Communicator>> groups[] = {
        {GroupKind::Tp, g.tp}, {GroupKind::Dp, g.dp}, {GroupKind::Pp, g.pp}};
    for (const auto& [kind, comm] : groups) {
      // Each member says who it is; the list must be the arithmetic's, in group-rank order.
      const auto expected = group_members(l, kind, r);
      ASSERT_EQ(comm->size(), static_cast<int>(expected.size()));
      EXPECT_EQ(expected[comm->rank()], r);
      Tensor who = tensor::zeros({comm->size()}, DType::I32);
      comm->allgather(ints({r}, DType::I32), who)->wait();
      const auto got = values(who);
      EXPECT_EQ(std::vector<int64_t>(expected.begin(), expected.end()), got)
          << "tp=" << tp << " pp=" << pp << " group " << comm->name();
    }
    // The groups work independently: a dp allreduce sums over the dp members only.
    Tensor t = ints({r}, DType::I64);
    g.dp->allreduce(t)->wait();
    int64_t expect = 0;
    for (int m : group_members(l, GroupKind::Dp, r)) expect += m;
    EXPECT_EQ(values(t)[0], expect);
  }
}

TEST(CommMpi, SplitWithNegativeColorLeavesTheRankOut) {
  const int r = world()->rank(), n = world()->size();
  auto odd = world()->split(r % 2 == 1 ? 0 : -1, -r, "odd");  // key -r: reversed order
  if (r % 2 == 0) {
    EXPECT_EQ(odd, nullptr);
    return;
  }
  ASSERT_NE(odd, nullptr);
  EXPECT_EQ(odd->size(), n / 2);
  // Ordered by key -r: the largest odd rank first.
  const int largest_odd = n % 2 == 0 ? n - 1 : n - 2;
  EXPECT_EQ(odd->rank(), (largest_odd - r) / 2);
  Tensor t = ints({r}, DType::I32);
  odd->allreduce(t)->wait();
  int64_t sum = 0;
  for (int q = 1; q < n; q += 2) sum += q;
  EXPECT_EQ(values(t)[0], sum);
}

TEST(CommMpi, BarrierAndDone) {
  Tensor t = tensor::ones({10}, DType::F32);
  auto w = world()->allreduce(t);
  world()->barrier();
  EXPECT_TRUE(w->done());  // barrier returns after this rank's queued ops finished
  w->wait();
  EXPECT_EQ(tensor::to_float_vector(t)[0], world()->size());
}

TEST(CommMpi, MistakesRaiseBeforeAnythingIsQueued) {
  auto& w = *world();
  const int n = w.size();
  // Wrong sizes, dtypes and peers fail on the calling rank at once; no collective is issued,
  // so the ranks stay in step.
  EXPECT_THROW(w.reduce_scatter(tensor::zeros({n * 4 + 1}), tensor::zeros({4})), UserError);
  EXPECT_THROW(w.allgather(tensor::zeros({4}), tensor::zeros({n * 4 + 1})), UserError);
  EXPECT_THROW(w.allgather(tensor::zeros({4}), tensor::zeros({n * 4}, DType::I32)), UserError);
  EXPECT_THROW(w.allreduce(tensor::zeros({4, 4}).transpose(0, 1)), UserError);
  EXPECT_THROW(w.broadcast(tensor::zeros({4}), n), UserError);
  EXPECT_THROW(w.send(tensor::zeros({4}), w.rank()), UserError);
  EXPECT_THROW(w.recv(tensor::zeros({4}), -1), UserError);
  try {
    w.allreduce(tensor::zeros({4}, DType::U8));
    FAIL() << "u8 allreduce accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'world'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("u8"), std::string::npos) << e.what();
  }
}

TEST(CommMpi, WatchdogNamesTheStuckOpAndTheLateOpStillCompletes) {
  const int n = world()->size(), r = world()->rank();
  if (n == 1) GTEST_SKIP() << "nothing can hang in a world of one";
  auto c = world()->split(0, r, "watchdog");
  c->set_timeout(std::chrono::milliseconds(300));
  Tensor t = tensor::ones({4}, DType::F32);
  if (r == 0) {
    // Rank 0 enters an allreduce the others join only after its wait() gave up.
    auto w = c->allreduce(t);
    try {
      w->wait();
      FAIL() << "wait() returned although the peers never joined";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(fmt::format("communicator 'watchdog' (mpi, rank 0 of {}): allreduce of 4 "
                                     "f32 did not finish within 300 ms; a peer rank has probably "
                                     "died or hangs",
                                     n)),
                std::string::npos)
          << msg;
    }
    EXPECT_FALSE(w->done());
    EXPECT_THROW(c->allreduce(t), UserError);  // a timed-out communicator takes no more ops
    world()->barrier();
    // The peers join now; the stuck op completes, so the communicator can be closed cleanly.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!w->done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(w->done());
    w->wait();
  } else {
    world()->barrier();
    c->allreduce(t)->wait();
  }
  EXPECT_EQ(tensor::to_float_vector(t)[0], n);
}

// ---- GPU: the nccl backend, and the mpi backend staging GPU tensors through the host. These skip
// themselves unless every rank has a GPU of its own (docs/gpu.md, docs/distributed.md).

// The same answer on every rank, so all skip or none does (the tests are collective).
bool every_rank_has_a_gpu() {
  const LaunchInfo l = detect_launch();
  Tensor ok = ints({tensor::cuda_device_count() >= l.local_size ? 1 : 0}, DType::I32);
  world()->allreduce(ok, ReduceOp::Min)->wait();
  return values(ok)[0] == 1;
}

Device my_gpu() {
  return launch_device(Device::cuda(0), detect_launch());
}

TEST(CommGpu, MpiStagesGpuTensorsThroughTheHost) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  const int n = world()->size(), r = world()->rank();
  const Device dev = my_gpu();
  Tensor t = ints({r, 10 + r, 20 + r}, DType::F32).to(dev);
  world()->allreduce(t)->wait();
  const int64_t s = n * (n - 1) / 2;
  EXPECT_EQ(values(t), (std::vector<int64_t>{s, 10 * n + s, 20 * n + s}));
  Tensor whole = tensor::zeros({2 * n}, DType::BF16, dev);
  world()
      ->allgather(whole.narrow(0, 2 * r, 2).copy_(ints({r, r}, DType::BF16).to(dev)), whole)
      ->wait();
  for (int q = 0; q < n; ++q) EXPECT_EQ(values(whole)[2 * q], q);
}

TEST(CommNccl, EveryOpOnTheGpu) {
  if (!nccl_built()) GTEST_SKIP() << "built without NCCL";
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  const int n = world()->size(), r = world()->rank();
  const Device dev = my_gpu();
  auto nccl = make_nccl_communicator(world(), dev, "nccl", std::chrono::seconds(60));
  EXPECT_EQ(nccl->size(), n);
  EXPECT_EQ(nccl->rank(), r);
  EXPECT_EQ(nccl->backend(), "nccl");
  // Small integers: exact in bf16 and f16 too.
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    std::vector<int64_t> v(300);
    for (int64_t i = 0; i < 300; ++i) v[i] = (r + i) % 8;
    Tensor sum = ints(v, d).to(dev), mx = ints(v, d).to(dev);
    auto w1 = nccl->allreduce(sum);
    auto w2 = nccl->allreduce(mx, ReduceOp::Max);
    w2->wait();
    w1->wait();
    const auto gs = values(sum), gm = values(mx);
    for (int64_t i = 0; i < 300; ++i) {
      int64_t es = 0, em = 0;
      for (int q = 0; q < n; ++q) {
        es += (q + i) % 8;
        em = std::max<int64_t>(em, (q + i) % 8);
      }
      ASSERT_EQ(gs[i], es) << dtype_name(d) << " i=" << i;
      ASSERT_EQ(gm[i], em) << dtype_name(d) << " i=" << i;
    }
  }
  // reduce_scatter into this rank's chunk of the input (NCCL's in-place form).
  const int64_t k = 1000;
  std::vector<int64_t> v(n * k);
  for (int64_t j = 0; j < n * k; ++j) v[j] = j % 7 + r;
  Tensor flat = ints(v, DType::F32).to(dev);
  nccl->reduce_scatter(flat, flat.narrow(0, r * k, k))->wait();
  const auto got = values(flat.narrow(0, r * k, k));
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_EQ(got[i], n * ((r * k + i) % 7) + n * (n - 1) / 2) << i;
  }
  // allgather in place, and broadcast from the last rank (bytes: any dtype).
  Tensor whole = tensor::zeros({n * k}, DType::BF16, dev);
  whole.narrow(0, r * k, k).fill_(r + 1);
  nccl->allgather(whole.narrow(0, r * k, k), whole)->wait();
  for (int q = 0; q < n; ++q) EXPECT_EQ(values(whole)[q * k + k - 1], q + 1);
  Tensor b = tensor::full({77}, r == n - 1 ? 5 : 0, DType::U8, dev);
  nccl->broadcast(b, n - 1)->wait();
  EXPECT_EQ(values(b)[76], 5);
  if (n > 1) {
    // Ring, even ranks sending first (Note [Collective order]).
    Tensor out = tensor::full({1 << 16}, r, DType::F32, dev),
           in = tensor::zeros({1 << 16}, DType::F32, dev);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      nccl->send(out, next)->wait();
      nccl->recv(in, prev)->wait();
    } else {
      nccl->recv(in, prev)->wait();
      nccl->send(out, next)->wait();
    }
    EXPECT_EQ(values(in)[100], prev);
  }
  // A split makes a working NCCL group.
  auto half = nccl->split(r % 2, r, "half");
  ASSERT_NE(half, nullptr);
  Tensor t = ints({r}, DType::I64).to(dev);
  half->allreduce(t)->wait();
  int64_t expect = 0;
  for (int q = r % 2; q < n; q += 2) expect += q;
  EXPECT_EQ(values(t)[0], expect);
  nccl->barrier();
  // Mistakes: CPU tensors and another device's tensors.
  EXPECT_THROW(nccl->allreduce(tensor::zeros({4})), UserError);
}

}  // namespace
}  // namespace strata::comm
