#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <chrono>

#include "autograd/functions.h"
#include "parallel/engine.h"
#include "tensor/ops.h"

namespace strata::parallel {

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineScheduleKind::GPipe;
  if (name == "1f1b") return PipelineScheduleKind::OneFOneB;
  user_error("parallelism.pipeline_schedule must be 'gpipe' or '1f1b', got '{}'", name);
}

const char* pipeline_schedule_name(PipelineScheduleKind kind) {
  return kind == PipelineScheduleKind::GPipe ? "gpipe" : "1f1b";
}

double pipeline_bubble_formula(int stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

PipelineSchedule::PipelineSchedule(PipelineScheduleKind kind,
                                   std::shared_ptr<comm::Communicator> pp)
    : kind_(kind), pp_(std::move(pp)), links_(*pp_) {}

namespace {

// One micro-batch between its forward and its backward on this stage.
struct InFlight {
  MicroBatch batch;
  autograd::Variable input;   // the received hidden states (a leaf), not on the first stage
  autograd::Variable output;  // the sent hidden states, or the scaled loss on the last stage
  tensor::Tensor loss;        // [1], last stage
};

}  // namespace

std::vector<tensor::Tensor> PipelineSchedule::run(Engine& engine, models::CausalLM& model,
                                                  const TrainStepInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  links_.reset_idle();
  const int64_t A = in.micro_batches;
  const int p = links_.stages(), s = links_.stage();
  STRATA_CHECK(model.is_first_stage() == links_.first() && model.is_last_stage() == links_.last(),
               "stage {} of {} holds layers [{}, {}) of {}", s, p, model.stage_layers().begin,
               model.stage_layers().end, model.num_layers());
  const float weight = in.loss_factor / static_cast<float>(A);
  const int64_t C = model.hidden_size();
  const DType dtype = engine.param_dtype();
  const Device device = model.flat_units().front().params.device();

  std::vector<InFlight> flight(static_cast<size_t>(A));
  std::vector<comm::WorkHandle> sends;
  std::vector<tensor::Tensor> losses(static_cast<size_t>(A));
  int held = 0;
  stats_.max_in_flight = 0;

  // Waits for a receive after polling every pending send (Work::done). On a GPU a poll only
  // reads events: a send's kernel runs by itself on its communicator's stream. The CUDA emulator
  // (Note [Emulated streams]) runs queued stream work only when the host waits for it or polls
  // it, so there a send issued just before this stage waits on its neighbour (GPipe's last
  // forward, then its first backward) would stay queued while the neighbour waits for it: the
  // poll starts it.
  auto receive = [&](const comm::WorkHandle& work) {
    for (const comm::WorkHandle& w : sends) w->done();
    links_.wait_recv(work);
  };

  auto forward = [&](int64_t m) {
    InFlight& f = flight[static_cast<size_t>(m)];
    f.batch = in.batch(m);
    // Under sequence parallelism a stage's hidden states are this rank's share of the sequence.
    const models::nn::TensorParallel& tp = model.tensor_parallel();
    const int64_t M = f.batch.ids.size(0), T = f.batch.ids.size(1) / (tp.sp() ? tp.size() : 1);
    if (!links_.first()) {
      tensor::Tensor buf = tensor::Tensor::empty({M, T, C}, dtype, device);
      receive(links_.recv_forward(buf));
      f.input = autograd::Variable(buf, /*requires_grad=*/true);
    }
    if (links_.last()) {
      autograd::Variable loss;
      {
        // Note [Fused cross-entropy gradient]: the gradient this loss will receive.
        const autograd::LossGradientScope grad(engine.loss_gradient(weight));
        loss = model.stage_loss(f.batch.ids, f.input, f.batch.targets);
      }
      f.loss = loss.data().reshape({1});
      f.output = weight == 1.f ? loss : autograd::scale(loss, weight);
    } else {
      f.output = model.forward_stage(f.batch.ids, f.input);
      sends.push_back(links_.send_forward(f.output.data()));
    }
    stats_.max_in_flight = std::max(stats_.max_in_flight, ++held);
  };

  auto backward = [&](int64_t m) {
    InFlight& f = flight[static_cast<size_t>(m)];
    engine.begin_micro_batch(m == A - 1);
    if (links_.last()) {
      engine.backward(f.output);
    } else {
      tensor::Tensor grad =
          tensor::Tensor::empty(f.output.data().shape(), f.output.data().dtype(), device);
      receive(links_.recv_backward(grad));
      engine.backward(f.output, grad);
    }
    if (!links_.first()) {
      STRATA_CHECK(f.input.grad().defined(), "stage {} got no gradient for its input", s);
      sends.push_back(links_.send_backward(f.input.grad()));
    }
    losses[static_cast<size_t>(m)] = f.loss;
    // The activations go (a send holds its own handle on the gradient it sends), and so do the
    // tensors of sends already done.
    f = InFlight();
    --held;
    std::erase_if(sends, [](const comm::WorkHandle& w) {
      if (!w->done()) return false;
      w->wait();  // rethrows a failed send (Note [Failed ranks])
      return true;
    });
  };

  if (kind_ == PipelineScheduleKind::GPipe) {
    for (int64_t m = 0; m < A; ++m) forward(m);
    for (int64_t m = 0; m < A; ++m) backward(m);
  } else {
    const int64_t warmup = std::min<int64_t>(p - s - 1, A);
    for (int64_t m = 0; m < warmup; ++m) forward(m);
    for (int64_t m = warmup; m < A; ++m) {
      forward(m);
      backward(m - warmup);
    }
    for (int64_t m = A - warmup; m < A; ++m) backward(m);
  }
  for (const comm::WorkHandle& w : sends) w->wait();
  flight.clear();

  // Every stage returns the last stage's losses (Note [Pipeline schedules]).
  if (p > 1) {
    tensor::Tensor all =
        links_.last() ? tensor::concat(losses, 0) : tensor::Tensor::empty({A}, DType::F32, device);
    pp_->broadcast(all, p - 1)->wait();
    for (int64_t m = 0; m < A; ++m) losses[static_cast<size_t>(m)] = all.narrow(0, m, 1);
  }
  stats_.idle_seconds = links_.idle_seconds();
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return losses;
}

tensor::Tensor PipelineSchedule::forward_loss(models::CausalLM& model, const tensor::Tensor& ids,
                                              const tensor::Tensor& targets) {
  const autograd::NoGradGuard no_grad;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  const int64_t M = ids.size(0), T = ids.size(1) / (tp.sp() ? tp.size() : 1);
  const tensor::Tensor& params = model.flat_units().front().params;
  autograd::Variable hidden;
  if (!links_.first()) {
    tensor::Tensor buf =
        tensor::Tensor::empty({M, T, model.hidden_size()}, params.dtype(), params.device());
    links_.recv_forward(buf)->wait();
    hidden = autograd::Variable(buf, /*requires_grad=*/false);
  }
  tensor::Tensor loss;
  if (links_.last()) {
    loss = model.stage_loss(ids, hidden, targets).data().reshape({1}).to(DType::F32);
  } else {
    links_.send_forward(model.forward_stage(ids, hidden).data())->wait();
    loss = tensor::Tensor::empty({1}, DType::F32, params.device());
  }
  pp_->broadcast(loss, links_.stages() - 1)->wait();
  return loss;
}

}  // namespace strata::parallel

namespace strata::parallel {

PipelineSchedule& install_pipeline(Engine& engine, models::CausalLM& model,
                                   std::shared_ptr<comm::Communicator> pp,
                                   PipelineScheduleKind kind) {
  STRATA_CHECK(pp != nullptr, "install_pipeline without a pp communicator");
  const int p = pp->size(), s = pp->rank();
  Engine::PipelineSync sync;
  sync.pp = p > 1 ? pp : nullptr;
  if (p > 1 && model.ties_embeddings()) {
    const bool ends = s == 0 || s == p - 1;
    std::shared_ptr<comm::Communicator> tied = pp->split(ends ? 0 : -1, s, "pp-tied");
    if (ends) {
      const std::vector<models::FlatUnit>& units = model.flat_units();
      int u = 0;
      while (u < static_cast<int>(units.size()) && units[u].name != "embeddings") ++u;
      STRATA_CHECK(u < static_cast<int>(units.size()),
                   "stage {} of a model with tied embeddings has no 'embeddings' unit", s);
      sync.tied = std::move(tied);
      sync.tied_units = {u};
      sync.count_tied_in_norm = s == 0;
    }
  }
  auto schedule = std::make_unique<PipelineSchedule>(kind, pp);
  PipelineSchedule& ref = *schedule;
  engine.set_pipeline(std::move(schedule), std::move(sync));
  return ref;
}

}  // namespace strata::parallel
