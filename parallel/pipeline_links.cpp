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

PipelineLinks::PipelineLinks(comm::Communicator& pp, bool wrap)
    : stage_(pp.rank()), stages_(pp.size()) {
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
  if (wrap) {
    const int color = first() || last() ? 0 : -1;
    act_wrap_ = pp.split(color, stage_, "pp-act-wrap");  // null on a middle stage
    grad_wrap_ = pp.split(color, stage_, "pp-grad-wrap");
    STRATA_CHECK(
        color < 0 || (act_wrap_ && act_wrap_->size() == 2 && grad_wrap_ && grad_wrap_->size() == 2),
        "no wrap-around link between the last stage and the first");
  }
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

comm::WorkHandle PipelineLinks::send_forward_wrap(tensor::Tensor t) {
  STRATA_CHECK(last() && act_wrap_, "only the last stage sends on the wrap-around link");
  return act_wrap_->send(std::move(t), 0);
}

comm::WorkHandle PipelineLinks::recv_forward_wrap(tensor::Tensor t) {
  STRATA_CHECK(first() && act_wrap_, "only the first stage receives on the wrap-around link");
  return act_wrap_->recv(std::move(t), 1);
}

comm::WorkHandle PipelineLinks::send_backward_wrap(tensor::Tensor t) {
  STRATA_CHECK(first() && grad_wrap_, "only the first stage sends gradients around");
  return grad_wrap_->send(std::move(t), 1);
}

comm::WorkHandle PipelineLinks::recv_backward_wrap(tensor::Tensor t) {
  STRATA_CHECK(last() && grad_wrap_, "only the last stage receives gradients around");
  return grad_wrap_->recv(std::move(t), 0);
}

void PipelineLinks::wait_recv(const comm::WorkHandle& work) {
  const auto start = std::chrono::steady_clock::now();
  work->wait();
  idle_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata::parallel
