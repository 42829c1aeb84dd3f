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
//
// The interleaved schedule (Note [Virtual pipeline stages] in models/causal_lm.h) also needs the
// wrap-around link: chunk c of the last stage feeds chunk c + 1 of the first. With `wrap` that
// link gets its two communicators as well (one more split per direction, stage 0 and stage
// p - 1 in it): "activations" carries only p - 1 -> 0, "gradients" only 0 -> p - 1, so the
// argument above holds for it too (at p = 2 it is a second pair between the same two ranks).
#include <chrono>
#include <memory>
#include <utility>

#include "comm/communicator.h"

namespace strata::parallel {

class PipelineLinks {
 public:
  // Collective over `pp` (rank = stage). pp of one rank: no links. `wrap`: the wrap-around
  // link between the last stage and the first as well (Note [Pipeline channels]).
  explicit PipelineLinks(comm::Communicator& pp, bool wrap = false);

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
  // The wrap-around link: the last stage's activations to the first stage, and their
  // gradients from the first stage back to the last.
  bool wraps() const { return act_wrap_ != nullptr; }
  comm::WorkHandle send_forward_wrap(tensor::Tensor t);   // last stage
  comm::WorkHandle recv_forward_wrap(tensor::Tensor t);   // first stage
  comm::WorkHandle send_backward_wrap(tensor::Tensor t);  // first stage
  comm::WorkHandle recv_backward_wrap(tensor::Tensor t);  // last stage
  // Between consecutive chunks of the model (Note [Virtual pipeline stages]): the previous
  // chunk's activations come from the previous stage, or on the first stage over the wrap link;
  // the next chunk's go to the next stage, or from the last stage over the wrap link; the
  // gradients go the opposite ways. Without interleaving a stage never calls these where a wrap
  // link would be needed (its first stage holds the first chunk, its last the last).
  comm::WorkHandle recv_chunk_input(tensor::Tensor t) {
    return first() ? recv_forward_wrap(std::move(t)) : recv_forward(std::move(t));
  }
  comm::WorkHandle send_chunk_output(tensor::Tensor t) {
    return last() ? send_forward_wrap(std::move(t)) : send_forward(std::move(t));
  }
  comm::WorkHandle recv_chunk_output_grad(tensor::Tensor t) {
    return last() ? recv_backward_wrap(std::move(t)) : recv_backward(std::move(t));
  }
  comm::WorkHandle send_chunk_input_grad(tensor::Tensor t) {
    return first() ? send_backward_wrap(std::move(t)) : send_backward(std::move(t));
  }

  // Waits for a receive, adding the time spent to idle_seconds().
  void wait_recv(const comm::WorkHandle& work);
  double idle_seconds() const { return idle_; }
  void reset_idle() { idle_ = 0; }

 private:
  int stage_ = 0, stages_ = 1;
  // Two-rank communicators: the lower stage is rank 0, the higher rank 1.
  std::unique_ptr<comm::Communicator> act_next_, act_prev_, grad_next_, grad_prev_;
  // The wrap-around link, stage 0 is rank 0 and stage p - 1 rank 1; null without it.
  std::unique_ptr<comm::Communicator> act_wrap_, grad_wrap_;
  double idle_ = 0;
};

}  // namespace strata::parallel
