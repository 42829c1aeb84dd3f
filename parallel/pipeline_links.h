#pragma once
// PipelineLinks: the point-to-point channels between neighbouring pipeline stages — activations
// forward to the next stage, their gradients back to the previous one.
//
// Note [Pipeline channels]
// Ops on one communicator run one at a time in issue order (Note [Collective order]), so a
// stage that sends on the channel its neighbour is also sending on can deadlock, and a receive
// posted early would hold up every send issued after it. Each link between stages k and k + 1
// therefore gets two communicators of its own, one per direction: "activations" carries only
// k -> k + 1, "gradients" only k + 1 -> k. On each of them one rank only sends and the other
// only receives, both in micro-batch order, so every op finds its match and no schedule that
// issues each stage's sends and receives in micro-batch order can deadlock, whatever it
// interleaves between directions. The communicators come from four splits of the pp group (even
// and odd links, per direction), collective over it. Every op is asynchronous (WorkHandle);
// the schedule waits on a receive only when its compute needs the data, and records how long it
// waited (the pipeline bubble).
#include <chrono>
#include <memory>

#include "comm/communicator.h"

namespace strata::parallel {

class PipelineLinks {
 public:
  // Collective over `pp` (rank = stage). pp of one rank: no links.
  explicit PipelineLinks(comm::Communicator& pp);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }

  // To the next stage / from the previous one (activations).
  comm::WorkHandle send_forward(tensor::Tensor t);
  comm::WorkHandle recv_forward(tensor::Tensor t);
  // To the previous stage / from the next one (gradients of the activations).
  comm::WorkHandle send_backward(tensor::Tensor t);
  comm::WorkHandle recv_backward(tensor::Tensor t);

  // Waits for a receive, adding the time spent to idle_seconds().
  void wait_recv(const comm::WorkHandle& work);
  double idle_seconds() const { return idle_; }
  void reset_idle() { idle_ = 0; }

 private:
  int stage_ = 0, stages_ = 1;
  // Two-rank communicators: the lower stage is rank 0, the higher rank 1.
  std::unique_ptr<comm::Communicator> act_next_, act_prev_, grad_next_, grad_prev_;
  double idle_ = 0;
};

}  // namespace strata::parallel
