#include "parallel/pipeline_links.h"

#include <string>

#include "core/error.h"

namespace strata::parallel {

namespace {

// Link k joins stages k and k + 1; one split holds the even links, another the odd ones. The
// link of `stage` in the split of parity `parity`, or -1 when it has none there.
int link_color(int stage, int stages, int parity) {
  const int k = stage % 2 == parity ? stage : stage - 1;
  return k >= 0 && k <= stages - 2 ? k : -1;
}

}  // namespace

PipelineLinks::PipelineLinks(comm::Communicator& pp) : stage_(pp.rank()), stages_(pp.size()) {
  if (stages_ == 1) return;
  std::unique_ptr<comm::Communicator> act[2], grad[2];
  for (int parity = 0; parity < 2; ++parity) {
    const int color = link_color(stage_, stages_, parity);
    act[parity] = pp.split(color, stage_, "pp-act");
    grad[parity] = pp.split(color, stage_, "pp-grad");
  }
  // The link to the next stage is link stage_, to the previous one link stage_ - 1.
  if (!last()) {
    act_next_ = std::move(act[stage_ % 2]);
    grad_next_ = std::move(grad[stage_ % 2]);
  }
  if (!first()) {
    act_prev_ = std::move(act[(stage_ - 1) % 2]);
    grad_prev_ = std::move(grad[(stage_ - 1) % 2]);
  }
  STRATA_CHECK(last() || (act_next_ && act_next_->size() == 2), "no link to the next stage");
  STRATA_CHECK(first() || (act_prev_ && act_prev_->size() == 2), "no link to the previous stage");
}

comm::WorkHandle PipelineLinks::send_forward(tensor::Tensor t) {
  STRATA_CHECK(!last(), "the last stage sends nothing forward");
  return act_next_->send(std::move(t), 1);
}

comm::WorkHandle PipelineLinks::recv_forward(tensor::Tensor t) {
  STRATA_CHECK(!first(), "the first stage receives nothing forward");
  return act_prev_->recv(std::move(t), 0);
}

comm::WorkHandle PipelineLinks::send_backward(tensor::Tensor t) {
  STRATA_CHECK(!first(), "the first stage sends no gradient back");
  return grad_prev_->send(std::move(t), 0);
}

comm::WorkHandle PipelineLinks::recv_backward(tensor::Tensor t) {
  STRATA_CHECK(!last(), "the last stage receives no gradient");
  return grad_next_->recv(std::move(t), 1);
}

void PipelineLinks::wait_recv(const comm::WorkHandle& work) {
  const auto start = std::chrono::steady_clock::now();
  work->wait();
  idle_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata::parallel
