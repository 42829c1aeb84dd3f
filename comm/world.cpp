#include "comm/world.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "comm/comm_common.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/self_communicator.h"
#include "tensor/cuda.h"

namespace strata::comm {

namespace {

std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  STRATA_USER_CHECK(*end == '\0' && x >= 0 && x < (1L << 30),
                    "environment variable {}={} is not a rank or a count", name, v);
  return static_cast<int>(x);
}

struct WorldState {
  std::mutex mu;
  std::shared_ptr<Communicator> world;
  std::string backend;  // the one running
};

WorldState& state() {
  static WorldState s;
  return s;
}

std::string resolve_backend(const std::string& backend, Device device, const LaunchInfo& launch) {
  if (backend != "auto") return backend;
  if (device.is_cuda() && nccl_built() && tensor::cuda_available()) return "nccl";
  if (launch.launcher != "none") {
    if (mpi_built()) return "mpi";
    STRATA_USER_CHECK(launch.size == 1,
                      "{} started {} ranks, but this Strata build has no MPI; install an MPI "
                      "(e.g. libopenmpi-dev) and rebuild, or run a single process",
                      launch.launcher, launch.size);
  }
  return "self";
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  if (auto rank = env_int("OMPI_COMM_WORLD_RANK")) {
    info.launcher = "mpirun";
    info.rank = *rank;
    info.size = env_int("OMPI_COMM_WORLD_SIZE").value_or(1);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    info.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  } else if (auto rank = env_int("PMI_RANK")) {
    info.launcher = "mpirun";
    info.rank = *rank;
    info.size = env_int("PMI_SIZE").value_or(1);
    // MPICH's Hydra names the node-local values so.
    info.local_rank = env_int("MPI_LOCALRANKID").value_or(0);
    info.local_size = env_int("MPI_LOCALNRANKS").value_or(1);
  } else if (auto rank = env_int("SLURM_PROCID")) {
    info.launcher = "srun";
    info.rank = *rank;
    // Inside an srun step SLURM_STEP_NUM_TASKS is the step's size; SLURM_NTASKS the job's.
    info.size = env_int("SLURM_STEP_NUM_TASKS").value_or(env_int("SLURM_NTASKS").value_or(1));
    info.local_rank = env_int("SLURM_LOCALID").value_or(0);
    info.local_size = env_int("SLURM_NTASKS_PER_NODE").value_or(info.size);
  }
  STRATA_USER_CHECK(info.size >= 1 && info.rank < info.size && info.local_rank < info.local_size,
                    "the launcher's environment ({}) says rank {} of {}, local rank {} of {}, "
                    "which is inconsistent",
                    info.launcher, info.rank, info.size, info.local_rank, info.local_size);
  return info;
}

Device launch_device(Device requested, const LaunchInfo& launch) {
  if (!requested.is_cuda() || launch.local_size == 1) return requested;
  STRATA_USER_CHECK(requested.index == 0,
                    "device {} was asked for, but {} started {} ranks on this node: each rank "
                    "takes the GPU of its local rank; write device: cuda",
                    requested.str(), launch.launcher, launch.local_size);
  return Device::cuda(launch.local_rank);
}

std::shared_ptr<Communicator> init_world(const std::string& backend, Device device,
                                         std::chrono::milliseconds timeout) {
  STRATA_USER_CHECK(backend == "auto" || backend == "self" || backend == "mpi" || backend == "nccl",
                    "unknown communication backend '{}': use auto, self, mpi or nccl", backend);
  STRATA_USER_CHECK(timeout.count() > 0, "communication timeout must be positive, got {} ms",
                    timeout.count());
  auto& s = state();
  std::lock_guard lk(s.mu);
  const LaunchInfo launch = detect_launch();
  const std::string chosen = resolve_backend(backend, device, launch);
  if (s.world) {
    STRATA_USER_CHECK(backend == "auto" || chosen == s.backend,
                      "init_world: the world already runs on backend '{}', '{}' was asked for",
                      s.backend, chosen);
    return s.world;
  }
  if (chosen == "self") {
    STRATA_USER_CHECK(launch.size == 1,
                      "backend 'self' is a world of one, but {} started {} ranks; use backend "
                      "mpi (or auto)",
                      launch.launcher, launch.size);
    s.world = std::make_shared<SelfCommunicator>("world");
  } else if (chosen == "mpi") {
    s.world = make_mpi_world("world", timeout);
  } else {
    STRATA_USER_CHECK(nccl_built(),
                      "backend 'nccl' was asked for, but this Strata build has no NCCL (it needs "
                      "the CUDA toolkit with nccl.h and libnccl); use backend mpi");
    STRATA_USER_CHECK(device.is_cuda(),
                      "backend 'nccl' moves GPU memory, but the device is {}; use device: cuda or "
                      "backend mpi",
                      device.str());
    STRATA_USER_CHECK(tensor::cuda_available(),
                      "backend 'nccl' needs a GPU, but none is visible to this process; check "
                      "nvidia-smi and CUDA_VISIBLE_DEVICES, or use backend mpi");
    // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); say so before it does.
    const int gpus = tensor::cuda_device_count();
    STRATA_USER_CHECK(launch.local_size <= gpus,
                      "backend 'nccl' needs a GPU per rank, but {} started {} ranks on this node, "
                      "which has {} visible GPU{}; start at most {} rank{} per node (mpirun "
                      "-npernode {}), or use backend mpi, whose ranks may share a GPU",
                      launch.launcher, launch.local_size, gpus, gpus == 1 ? "" : "s", gpus,
                      gpus == 1 ? "" : "s", gpus);
    std::shared_ptr<Communicator> bootstrap;
    if (mpi_built() && (launch.size > 1 || launch.launcher != "none")) {
      bootstrap = make_mpi_world("world-bootstrap", timeout);
    } else {
      STRATA_USER_CHECK(launch.size == 1,
                        "backend 'nccl' with {} ranks needs MPI to exchange the NCCL id, and this "
                        "build has none",
                        launch.size);
      bootstrap = std::make_shared<SelfCommunicator>("world-bootstrap");
    }
    s.world = make_nccl_communicator(std::move(bootstrap), device, "world", timeout);
  }
  STRATA_USER_CHECK(launch.launcher == "none" || s.world->size() == launch.size,
                    "{} started {} ranks, but the {} world has {}: the MPI library does not "
                    "match the launcher (e.g. srun without --mpi=pmix, or another MPI's mpirun)",
                    launch.launcher, launch.size, chosen, s.world->size());
  s.backend = chosen;
  return s.world;
}

std::shared_ptr<Communicator> current_world() {
  auto& s = state();
  std::lock_guard lk(s.mu);
  return s.world;
}

void abort_world(int exit_code) {
  std::fflush(nullptr);
  if (mpi_active()) mpi_abort(exit_code);
  std::_Exit(exit_code);
}

void finalize_world() {
  auto& s = state();
  {
    std::lock_guard lk(s.mu);
    s.world.reset();
  }
  mpi_finalize();
}

}  // namespace strata::comm
