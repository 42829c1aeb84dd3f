// The self communicator (a world of one) and the world's launch detection, without MPI.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "comm/self_communicator.h"
#include "comm/world.h"
#include "tensor/tensor.h"

namespace strata::comm {
namespace {

using tensor::Tensor;

// Through the interface, whose declarations carry the default arguments.
TEST(SelfCommunicator, EveryOpCompletesAtOnce) {
  SelfCommunicator self("dp");
  Communicator& c = self;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.backend(), "self");
  EXPECT_EQ(c.name(), "dp");

  Tensor t = tensor::from_vector({1, 2, 3}, {3});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    auto w = c.allreduce(t, op);
    EXPECT_TRUE(w->done());
    w->wait();
    EXPECT_EQ(tensor::to_float_vector(t), (std::vector<float>{1, 2, 3}));
  }
  Tensor out = tensor::zeros({3});
  c.reduce_scatter(t, out)->wait();
  EXPECT_EQ(tensor::to_float_vector(out), (std::vector<float>{1, 2, 3}));
  Tensor gathered = tensor::zeros({3}, DType::BF16);
  c.allgather(tensor::from_vector({4, 5, 6}, {3}, DType::BF16), gathered)->wait();
  EXPECT_EQ(tensor::to_float_vector(gathered), (std::vector<float>{4, 5, 6}));
  // In place: the input is the output itself.
  c.allgather(gathered, gathered)->wait();
  EXPECT_EQ(tensor::to_float_vector(gathered), (std::vector<float>{4, 5, 6}));
  c.broadcast(t, 0)->wait();
  c.barrier();
  EXPECT_EQ(tensor::to_float_vector(t), (std::vector<float>{1, 2, 3}));
}

TEST(SelfCommunicator, SendAndRecvHaveNoPeer) {
  SelfCommunicator self;
  Communicator& c = self;
  try {
    c.send(tensor::zeros({2}), 0);
    FAIL() << "send to self accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'world' (self, rank 0 of 1): send with "
                                         "itself"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.recv(tensor::zeros({2}), 0), UserError);
  EXPECT_THROW(c.recv(tensor::zeros({2}), 1), UserError);
  EXPECT_THROW(c.broadcast(tensor::zeros({2}), 1), UserError);
  EXPECT_THROW(c.reduce_scatter(tensor::zeros({4}), tensor::zeros({2})), UserError);
  EXPECT_THROW(c.allreduce(tensor::zeros({2}, DType::U8)), UserError);
}

TEST(SelfCommunicator, SplitMakesANamedGroupOrNone) {
  SelfCommunicator c;
  auto tp = c.split(0, 0, "tp");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(c.split(-1, 0, "none"), nullptr);
}

// Sets environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kLauncherVars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  static constexpr const char* kLauncherVars[] = {"OMPI_COMM_WORLD_RANK",
                                                  "OMPI_COMM_WORLD_SIZE",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                  "PMI_RANK",
                                                  "PMI_SIZE",
                                                  "MPI_LOCALRANKID",
                                                  "MPI_LOCALNRANKS",
                                                  "SLURM_PROCID",
                                                  "SLURM_NTASKS",
                                                  "SLURM_STEP_NUM_TASKS",
                                                  "SLURM_LOCALID",
                                                  "SLURM_NTASKS_PER_NODE"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(World, DetectsEachLauncher) {
  {
    ScopedEnv env({});
    const LaunchInfo l = detect_launch();
    EXPECT_EQ(l.launcher, "none");
    EXPECT_EQ(l.size, 1);
    EXPECT_EQ(l.rank, 0);
  }
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "5"},
                   {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    const LaunchInfo l = detect_launch();
    EXPECT_EQ(l.launcher, "mpirun");
    EXPECT_EQ(l.rank, 5);
    EXPECT_EQ(l.size, 8);
    EXPECT_EQ(l.local_rank, 1);
    EXPECT_EQ(l.local_size, 4);
  }
  {
    ScopedEnv env({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
    const LaunchInfo l = detect_launch();
    EXPECT_EQ(l.launcher, "mpirun");
    EXPECT_EQ(l.rank, 2);
    EXPECT_EQ(l.size, 3);
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "6"},
                   {"SLURM_NTASKS", "16"},
                   {"SLURM_STEP_NUM_TASKS", "8"},
                   {"SLURM_LOCALID", "2"},
                   {"SLURM_NTASKS_PER_NODE", "4"}});
    const LaunchInfo l = detect_launch();
    EXPECT_EQ(l.launcher, "srun");
    EXPECT_EQ(l.rank, 6);
    EXPECT_EQ(l.size, 8);  // the step's tasks, not the job's
    EXPECT_EQ(l.local_rank, 2);
    EXPECT_EQ(l.local_size, 4);
  }
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    EXPECT_THROW(detect_launch(), UserError);
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "x"}});
    EXPECT_THROW(detect_launch(), UserError);
  }
}

TEST(World, LaunchDeviceTakesTheLocalRanksGpu) {
  LaunchInfo one;
  EXPECT_EQ(launch_device(Device::cpu(), one), Device::cpu());
  EXPECT_EQ(launch_device(Device::cuda(1), one), Device::cuda(1));
  LaunchInfo four{.rank = 6, .size = 8, .local_rank = 2, .local_size = 4, .launcher = "srun"};
  EXPECT_EQ(launch_device(Device::cpu(), four), Device::cpu());
  EXPECT_EQ(launch_device(Device::cuda(0), four), Device::cuda(2));
  EXPECT_THROW(launch_device(Device::cuda(3), four), UserError);
}

TEST(World, BackendsAreCheckedBeforeAnythingStarts) {
  ScopedEnv env({});
  EXPECT_THROW(init_world("gloo", Device::cpu(), std::chrono::seconds(1)), UserError);
  EXPECT_THROW(init_world("auto", Device::cpu(), std::chrono::milliseconds(0)), UserError);
  try {
    init_world("nccl", Device::cpu(), std::chrono::seconds(1));
    FAIL() << "nccl accepted on a CPU";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
  }
}

TEST(World, SelfWorldIsIdempotentAndFinalizes) {
  ScopedEnv env({});
  auto w = init_world("auto", Device::cpu(), std::chrono::seconds(5));
  EXPECT_EQ(w->backend(), "self");
  EXPECT_EQ(init_world("self", Device::cpu(), std::chrono::seconds(5)), w);
  EXPECT_EQ(current_world(), w);
  EXPECT_THROW(init_world("mpi", Device::cpu(), std::chrono::seconds(5)), UserError);
  finalize_world();
  finalize_world();  // twice is fine
  EXPECT_EQ(current_world(), nullptr);
}

}  // namespace
}  // namespace strata::comm
