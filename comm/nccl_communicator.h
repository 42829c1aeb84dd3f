#pragma once
// The NCCL backend: collectives on GPU memory, bootstrapped through another communicator.
//
// Note [NCCL streams]
// Each NcclCommunicator owns a CUDA stream. An op first makes that stream wait for an event
// recorded on the compute stream (so it sees every kernel issued before it), launches the NCCL
// call, and records a completion event; Work::wait() blocks the host on that event (docs/design.md
// decision 8). Ops of one communicator run in issue order on its stream (Note [Collective order]).
// The GPU caching allocator is told the communication stream used each tensor (record_stream), so
// a tensor freed before its op finished is not reused too early. The watchdog (Note [Failed
// ranks]) polls the event and ncclCommGetAsyncError; on timeout it aborts the NCCL communicator so
// the stream does not stay blocked, and wait() raises.
#include <chrono>
#include <memory>
#include <string>

#include "core/device.h"
#include "comm/communicator.h"

namespace strata::comm {

// True when this binary was built with NCCL (CUDA toolkit with nccl.h and libnccl).
bool nccl_built();

// An NCCL communicator over the ranks of `bootstrap` (an MPI, or for a single rank a self,
// communicator) on `device`, this rank's GPU. Collective over `bootstrap`: rank 0 makes the NCCL
// unique id and broadcasts it. The communicator keeps `bootstrap` for split() and barrier().
// Raises a UserError without an NCCL build or without a visible GPU.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap,
                                                     Device device, std::string name,
                                                     std::chrono::milliseconds timeout);

}  // namespace strata::comm
