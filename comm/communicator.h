#pragma once
// Communicator: the collectives every parallel strategy is written against, behind one interface
// with three backends: `self` (a world of one, no launcher), `mpi` (host memory; GPU tensors are
// staged through the host when NCCL is not there) and `nccl` (GPU memory, bootstrapped through
// MPI).
//
// Note [Collective order]
// Every operation is asynchronous: it is queued and returns a Work handle at once. Operations on
// one communicator run one at a time, in the order they were issued, and every rank of the group
// must issue the same operations in the same order (as in MPI and NCCL). A caller may reuse or
// read a tensor only after the handle's wait() returns. Results are deterministic: the same
// inputs on the same number of ranks give the same bits (docs/design.md decision 9).
//
// Note [Failed ranks]
// A collective that does not complete within the communicator's timeout (a peer died or hangs)
// makes wait() raise strata::UserError naming the group, the operation and the ranks; the tools
// then abort the whole world (abort_world) so no rank is left waiting.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tensor/tensor.h"

namespace strata::comm {

enum class ReduceOp { Sum, Max, Min };

// A queued operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation has finished; rethrows its error (Note [Failed ranks]).
  virtual void wait() = 0;
  // True once finished (successfully or not); never blocks.
  virtual bool done() const = 0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "self", "mpi" or "nccl".
  virtual std::string_view backend() const = 0;
  // The group's name for messages: "world", "dp", "tp", "pp".
  virtual const std::string& name() const = 0;

  // Tensors are contiguous, on the device the backend serves (CPU for self/mpi; mpi stages CUDA
  // tensors through pinned host memory). Reductions take F32, I32, I64, BF16 and F16
  // (mpi: Note [Half-precision MPI reductions]); ops that only move data (broadcast, allgather,
  // send/recv) take every dtype. A mistake (sizes, dtype, device, peer) raises strata::UserError at
  // the call, before anything is queued. All ops follow Note [Collective order].

  // In place: every rank ends with the reduction of all ranks' `t`.
  virtual WorkHandle allreduce(tensor::Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  // input.numel() == size() * output.numel(); rank r's output is the reduction of chunk r of every
  // rank's input. `output` may lie inside `input` (e.g. chunk rank() of it).
  virtual WorkHandle reduce_scatter(tensor::Tensor input, tensor::Tensor output,
                                    ReduceOp op = ReduceOp::Sum) = 0;
  // output.numel() == size() * input.numel(); chunk r of the output is rank r's input. `input` may
  // be chunk rank() of `output` itself (in place).
  virtual WorkHandle allgather(tensor::Tensor input, tensor::Tensor output) = 0;
  // In place: every rank ends with `root`'s `t`.
  virtual WorkHandle broadcast(tensor::Tensor t, int root) = 0;
  // Point to point, matched by (peer, tag) in issue order (nccl: by issue order alone). Ops run
  // one at a time, so two ranks that both send to each other first deadlock, as with blocking
  // MPI: let one side receive first, or use two communicators.
  virtual WorkHandle send(tensor::Tensor t, int peer, int tag = 0) = 0;
  virtual WorkHandle recv(tensor::Tensor t, int peer, int tag = 0) = 0;
  // Returns when every rank of the group has called it (after this rank's queued ops finished).
  virtual void barrier() = 0;

  // A new communicator over the ranks that pass the same `color`, ordered by `key` (MPI_Comm_split
  // semantics); collective over this communicator. `name` names the new group in messages. A
  // negative color leaves this rank out (returns nullptr). The new group inherits the timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

  // Note [Failed ranks]: how long wait() lets one operation run before it fails.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

}  // namespace strata::comm
