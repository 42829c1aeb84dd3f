// Started under mpirun by dead_rank_launch_test.cpp: every rank runs allreduces in a loop,
// and rank 1 kills (`kill`) or stops (`stop`) itself after a few, or nobody fails (`ok`). The
// survivors must end the job (Note [Failed ranks]): as a tool would, they print the error and call
// abort_world().
//   comm_dead_rank_helper <kill|stop|ok> <timeout ms> <pid dir>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "comm/world.h"
#include "tensor/tensor.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <kill|stop|ok> <timeout ms> <pid dir>\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const auto timeout = std::chrono::milliseconds(std::atoi(argv[2]));
  int rank = -1;
  try {
    auto world = comm::init_world("mpi", Device::cpu(), timeout);
    rank = world->rank();
    // The test checks that no rank outlives the job.
    std::ofstream(std::string(argv[3]) + "/rank" + std::to_string(rank) + ".pid") << ::getpid();
    auto t = tensor::ones({1024}, DType::F32);
    for (int step = 0; step < 50; ++step) {
      if (step == 5 && rank == 1 && mode == "kill") ::raise(SIGKILL);
      if (step == 5 && rank == 1 && mode == "stop") ::raise(SIGSTOP);
      world->allreduce(t)->wait();
    }
    std::printf("rank %d: done\n", rank);
    world.reset();
    comm::finalize_world();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    comm::abort_world(1);
  }
}
