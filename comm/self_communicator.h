#pragma once
// SelfCommunicator: a group of one rank (a run without a launcher, or a tp/dp/pp group of size 1).
// Every op completes before it returns: reductions leave the tensor as it is, reduce_scatter and
// allgather copy input to output. There is no peer, so send and recv are user errors.
#include "comm/communicator.h"

namespace strata::comm {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name = "world") : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "self"; }
  const std::string& name() const override { return name_; }

  WorkHandle allreduce(tensor::Tensor t, ReduceOp op) override;
  WorkHandle reduce_scatter(tensor::Tensor input, tensor::Tensor output, ReduceOp op) override;
  WorkHandle allgather(tensor::Tensor input, tensor::Tensor output) override;
  WorkHandle broadcast(tensor::Tensor t, int root) override;
  WorkHandle send(tensor::Tensor t, int peer, int tag) override;
  WorkHandle recv(tensor::Tensor t, int peer, int tag) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  void set_timeout(std::chrono::milliseconds) override {}  // nothing can hang

 private:
  std::string name_;
};

}  // namespace strata::comm
