#pragma once
// The MPI backend: collectives on host memory, run by one communication thread per communicator.
//
// Note [MPI communication thread]
// Each MpiCommunicator owns a thread that takes queued ops in issue order (Note [Collective order])
// and runs them with blocking MPI calls, so the caller computes while MPI moves data. Because
// several communicators (world, tp, dp, pp) run their threads at once, MPI must be initialised
// with MPI_THREAD_MULTIPLE. A library that offers only MPI_THREAD_SERIALIZED still works: every MPI
// call then takes one process-wide lock, and ops use the non-blocking MPI calls polled with
// MPI_Test, so a thread never holds the lock while it waits for a peer. Less than SERIALIZED is a
// user error. The environment variable STRATA_MPI_THREAD_LEVEL=serialized forces the second mode
// (the tests run both).
//
// Tensors on the GPU are staged through pinned host buffers: the caller's thread copies them to
// the host when the op is issued and back when wait() returns (the comm thread never touches
// CUDA). A GPU op's results are therefore in place only after wait(), never at done().
//
// Results are deterministic: MPI's algorithm choice depends only on message size and group size,
// never on timing, so the same inputs on the same ranks give the same bits on every rank.
//
// The MPI error handler is MPI_ERRORS_RETURN, so an MPI failure becomes a strata::UserError with
// MPI's message (raised by the op's wait()) rather than an abort.
#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace strata::comm {

// True when this binary was built with MPI.
bool mpi_built();
// Initialises MPI once (see Note [MPI communication thread] for the thread level); accepts an MPI
// someone else initialised if its thread level suffices. Raises a UserError without an MPI build.
void mpi_init();
// True between mpi_init() (or someone else's MPI_Init) and mpi_finalize().
bool mpi_active();
// A communicator over every process (a duplicate of MPI_COMM_WORLD, so raw MPI calls on
// MPI_COMM_WORLD never match ours). Calls mpi_init() first.
std::unique_ptr<Communicator> make_mpi_world(std::string name, std::chrono::milliseconds timeout);
// Drains and closes every live MPI communicator, then MPI_Finalize. Safe to call twice. When a
// communicator still has an op that does not finish within its timeout, MPI_Finalize would hang:
// it logs the op and aborts the world instead.
void mpi_finalize();
// MPI_Abort(MPI_COMM_WORLD, code): ends every rank of the job.
[[noreturn]] void mpi_abort(int code);

}  // namespace strata::comm
