#pragma once
// The world: which process this is (from the launcher's environment), the world communicator, and
// how a run ends.
//
// A run is one process per device (docs/design.md decision 10), started by mpirun or srun, or
// alone.
// init_world() picks the backend, starts it once, and returns the world communicator;
// make_process_groups() (process_groups.h) splits it into tp/dp/pp groups. At the end,
// finalize_world(); after a failure (a UserError from a communicator's wait()), print it and call
// abort_world() so no rank is left waiting on a peer that will never come (Note [Failed ranks]).
#include <chrono>
#include <memory>
#include <string>

#include "core/device.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"

namespace strata::comm {

struct LaunchInfo {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string launcher = "none";  // "mpirun" (OpenMPI or a PMI launcher such as MPICH's), "srun"
};

// Reads the launcher's environment: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (OpenMPI),
// PMI_RANK/PMI_SIZE (MPICH/Intel MPI), SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun). None of
// them: a world of one.
LaunchInfo detect_launch();

// The device this rank computes on: `requested` as is for the CPU or a single rank per node; for
// `cuda` with several ranks per node, cuda:<local rank> (one process per GPU). An explicit
// cuda:N with several ranks per node is a UserError (every rank would take the same GPU).
Device launch_device(Device requested, const LaunchInfo& launch);

// Starts the world communicator, named "world". `backend`:
//   "self"  a world of one (an error when launched with more ranks);
//   "mpi"   MPI on host memory (GPU tensors staged through the host);
//   "nccl"  NCCL on `device` (a GPU), bootstrapped through MPI (or alone for a single rank);
//   "auto"  nccl when `device` is a GPU, NCCL is built and a GPU is visible; else mpi when a
//           launcher started this process and MPI is built; else self. A launcher with more
//           than one rank and a build without MPI is a UserError.
// `timeout`: Note [Failed ranks]. Idempotent: a second call returns the same world (asking for a
// different backend than the one running is a UserError).
std::shared_ptr<Communicator> init_world(const std::string& backend, Device device,
                                         std::chrono::milliseconds timeout);
// The world init_world() made, or nullptr before it.
std::shared_ptr<Communicator> current_world();

// Ends every rank now: MPI_Abort when MPI is running, else exits the process, with `exit_code`.
// Stdout and stderr are flushed first.
[[noreturn]] void abort_world(int exit_code);

// Drops the world, closes every communicator and finalises MPI when it is running. Safe to call
// twice and without init_world().
void finalize_world();

}  // namespace strata::comm
