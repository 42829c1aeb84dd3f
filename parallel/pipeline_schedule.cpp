#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <chrono>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "parallel/engine.h"
#include "tensor/ops.h"

namespace strata::parallel {

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineScheduleKind::GPipe;
  if (name == "1f1b") return PipelineScheduleKind::OneFOneB;
  if (name == "interleaved") return PipelineScheduleKind::Interleaved;
  user_error("parallelism.pipeline_schedule must be 'gpipe', '1f1b' or 'interleaved', got '{}'",
             name);
}

const char* pipeline_schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::GPipe:
      return "gpipe";
    case PipelineScheduleKind::OneFOneB:
      return "1f1b";
    case PipelineScheduleKind::Interleaved:
      return "interleaved";
  }
  return "?";
}

double pipeline_bubble_formula(int stages, int64_t micro_batches, int virtual_stages) {
  return static_cast<double>(stages - 1) /
         static_cast<double>(static_cast<int64_t>(virtual_stages) * micro_batches + stages - 1);
}

int64_t pipeline_warmup(PipelineScheduleKind kind, int stages, int virtual_stages,
                        int64_t micro_batches, int stage) {
  const int p = stages, v = virtual_stages, r = stage;
  const int64_t A = micro_batches;
  switch (kind) {
    case PipelineScheduleKind::GPipe:
      return A;
    case PipelineScheduleKind::OneFOneB:
      return std::min<int64_t>(p - r - 1, A);
    case PipelineScheduleKind::Interleaved: {
      // Note [Interleaved schedule]
      const int64_t total = A * v;
      if (A == p) return total;
      return std::min<int64_t>(
          static_cast<int64_t>(p - r - 1) * 2 + static_cast<int64_t>(v - 1) * p, total);
    }
  }
  return 0;
}

std::vector<PipelineOp> pipeline_order(PipelineScheduleKind kind, int stages, int virtual_stages,
                                       int64_t micro_batches, int stage) {
  const int p = stages, v = virtual_stages;
  const int64_t A = micro_batches;
  STRATA_CHECK(p >= 1 && stage >= 0 && stage < p && A >= 1 && v >= 1,
               "stage {} of {}, {} micro-batches, {} virtual stages", stage, p, A, v);
  STRATA_CHECK(v == 1 || kind == PipelineScheduleKind::Interleaved,
               "{} virtual stages need the interleaved schedule", v);
  if (kind == PipelineScheduleKind::Interleaved)
    STRATA_USER_CHECK(A % p == 0,
                      "the interleaved pipeline schedule runs the micro-batches in groups of "
                      "pipeline_parallel_size: batch.grad_accum_steps {} is not a multiple of {}",
                      A, p);
  const int64_t total = A * v;
  // Virtual index k -> (micro-batch, chunk); without interleaving k is the micro-batch.
  auto op = [&](int64_t k, bool forward) {
    if (v == 1) return PipelineOp{forward, k, 0};
    const int64_t group = k / (static_cast<int64_t>(p) * v), in = k % (static_cast<int64_t>(p) * v);
    const int c = static_cast<int>(in / p);
    return PipelineOp{forward, group * p + in % p, forward ? c : v - 1 - c};
  };
  const int64_t warmup = pipeline_warmup(kind, p, v, A, stage);
  std::vector<PipelineOp> order;
  order.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) order.push_back(op(k, true));
  for (int64_t i = 0; i < total - warmup; ++i) {
    order.push_back(op(warmup + i, true));
    order.push_back(op(i, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(op(k, false));
  return order;
}

PipelineSchedule::PipelineSchedule(PipelineScheduleKind kind,
                                   std::shared_ptr<comm::Communicator> pp, int virtual_stages)
    : kind_(kind),
      pp_(std::move(pp)),
      virtual_(virtual_stages),
      links_(*pp_, kind == PipelineScheduleKind::Interleaved) {
  STRATA_USER_CHECK(virtual_ >= 1, "parallelism.virtual_pipeline_stages must be >= 1, got {}",
                    virtual_);
  STRATA_USER_CHECK((kind_ == PipelineScheduleKind::Interleaved) == (virtual_ > 1),
                    "parallelism.pipeline_schedule '{}' with virtual_pipeline_stages {}: the "
                    "interleaved schedule needs virtual_pipeline_stages >= 2, the others 1",
                    pipeline_schedule_name(kind_), virtual_);
  STRATA_USER_CHECK(virtual_ == 1 || pp_->size() > 1,
                    "parallelism.virtual_pipeline_stages {} needs pipeline_parallel_size > 1",
                    virtual_);
}

namespace {

// One micro-batch's chunk between its forward and its backward on this stage.
struct InFlight {
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
  const int p = links_.stages(), s = links_.stage(), v = virtual_;
  STRATA_CHECK(model.is_first_stage() == links_.first() && model.is_last_stage() == links_.last() &&
                   model.num_chunks() == v,
               "stage {} of {} ({} chunks) holds layers [{}, {}) of {} in {} chunks", s, p, v,
               model.stage_layers().begin, model.stage_layers().end, model.num_layers(),
               model.num_chunks());
  const float weight = in.loss_factor / static_cast<float>(A);
  const int64_t C = model.hidden_size();
  const DType dtype = engine.param_dtype();
  const Device device = model.flat_units().front().params.device();
  const std::vector<PipelineOp> order = pipeline_order(kind_, p, v, A, s);

  // [chunk][micro-batch]
  std::vector<std::vector<InFlight>> flight(static_cast<size_t>(v),
                                            std::vector<InFlight>(static_cast<size_t>(A)));
  // in.batch(m) is called once per micro-batch, in order (chunk 0's forwards come in
  // micro-batch order and before the micro-batch's other chunks); held until its last backward
  // (chunk 0's), as its activations are.
  std::vector<MicroBatch> batches(static_cast<size_t>(A));
  std::vector<comm::WorkHandle> sends;
  std::vector<tensor::Tensor> losses(static_cast<size_t>(A));
  int held = 0;
  stats_.max_in_flight = 0;
  // Note [Partial passes]: interleaved, each backward goes through one chunk's units.
  std::vector<std::vector<bool>> chunk_units;
  if (v > 1) {
    const int n = static_cast<int>(model.flat_units().size());
    chunk_units.assign(static_cast<size_t>(v), std::vector<bool>(static_cast<size_t>(n), false));
    for (int u = 0; u < n; ++u) chunk_units[static_cast<size_t>(model.unit_chunk(u))][u] = true;
  }

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

  auto forward = [&](int64_t m, int c) {
    InFlight& f = flight[static_cast<size_t>(c)][static_cast<size_t>(m)];
    MicroBatch& batch = batches[static_cast<size_t>(m)];
    if (c == 0) batch = in.batch(m);
    // Under sequence parallelism a stage's hidden states are this rank's share of the sequence.
    const models::nn::TensorParallel& tp = model.tensor_parallel();
    const int64_t M = batch.ids.size(0), T = batch.ids.size(1) / (tp.sp() ? tp.size() : 1);
    if (!model.chunk_is_first(c)) {
      tensor::Tensor buf = tensor::Tensor::empty({M, T, C}, dtype, device);
      // Note [Interleaved schedule]: the first stage's later chunks are fed by the last stage.
      receive(links_.recv_chunk_input(buf));
      f.input = autograd::Variable(buf, /*requires_grad=*/true);
    }
    if (model.chunk_is_last(c)) {
      autograd::Variable loss;
      {
        // Note [Fused cross-entropy gradient]: the gradient this loss will receive.
        const autograd::LossGradientScope grad(engine.loss_gradient(weight));
        loss = model.stage_loss(batch.ids, f.input, batch.targets);
      }
      f.loss = loss.data().reshape({1});
      f.output = weight == 1.f ? loss : autograd::scale(loss, weight);
    } else {
      f.output = model.forward_stage(batch.ids, f.input, c);
      const tensor::Tensor& out = f.output.data();
      sends.push_back(links_.send_chunk_output(out));
    }
    stats_.max_in_flight = std::max(stats_.max_in_flight, ++held);
  };

  auto backward = [&](int64_t m, int c) {
    InFlight& f = flight[static_cast<size_t>(c)][static_cast<size_t>(m)];
    // Every chunk's backwards come in micro-batch order: micro-batch A - 1's launches the dp
    // reductions of the chunk's units (Note [Interleaved schedule]).
    if (v > 1)
      engine.begin_micro_batch(m == A - 1, chunk_units[static_cast<size_t>(c)]);
    else
      engine.begin_micro_batch(m == A - 1);
    if (model.chunk_is_last(c)) {
      engine.backward(f.output);
    } else {
      tensor::Tensor grad =
          tensor::Tensor::empty(f.output.data().shape(), f.output.data().dtype(), device);
      receive(links_.recv_chunk_output_grad(grad));
      engine.backward(f.output, grad);
    }
    if (!model.chunk_is_first(c)) {
      STRATA_CHECK(f.input.grad().defined(), "stage {} chunk {} got no gradient for its input", s,
                   c);
      const tensor::Tensor& g = f.input.grad();
      sends.push_back(links_.send_chunk_input_grad(g));
    }
    if (model.chunk_is_last(c)) losses[static_cast<size_t>(m)] = f.loss;
    if (c == 0) batches[static_cast<size_t>(m)] = MicroBatch();
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

  for (const PipelineOp& op : order) {
    if (op.forward)
      forward(op.micro_batch, op.chunk);
    else
      backward(op.micro_batch, op.chunk);
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

autograd::Variable PipelineSchedule::receive_hidden(const models::CausalLM& model, int chunk,
                                                    int64_t rows, int64_t seq) {
  if (model.chunk_is_first(chunk)) return {};
  const tensor::Tensor& params = model.flat_units().front().params;
  tensor::Tensor buf =
      tensor::Tensor::empty({rows, seq, model.hidden_size()}, params.dtype(), params.device());
  links_.recv_chunk_input(buf)->wait();
  return autograd::Variable(buf, /*requires_grad=*/false);
}

tensor::Tensor PipelineSchedule::forward_loss(models::CausalLM& model, const tensor::Tensor& ids,
                                              const tensor::Tensor& targets) {
  const autograd::NoGradGuard no_grad;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  const int64_t M = ids.size(0), T = ids.size(1) / (tp.sp() ? tp.size() : 1);
  const tensor::Tensor& params = model.flat_units().front().params;
  tensor::Tensor loss;
  // Chunk by chunk (Note [Interleaved schedule]): every rank's chunk c before any rank's c + 1.
  for (int c = 0; c < model.num_chunks(); ++c) {
    const autograd::Variable hidden = receive_hidden(model, c, M, T);
    if (model.chunk_is_last(c)) {
      loss = model.stage_loss(ids, hidden, targets).data().reshape({1}).to(DType::F32);
    } else {
      const tensor::Tensor out = model.forward_stage(ids, hidden, c).data();
      links_.send_chunk_output(out)->wait();
    }
  }
  if (!loss.defined()) loss = tensor::Tensor::empty({1}, DType::F32, params.device());
  pp_->broadcast(loss, links_.stages() - 1)->wait();
  return loss;
}

tensor::Tensor PipelineSchedule::forward_last_logits(models::CausalLM& model,
                                                     const tensor::Tensor& ids,
                                                     models::KvCache* cache) {
  const autograd::NoGradGuard no_grad;
  const models::nn::SequenceParallelPause no_sp;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  const int64_t M = ids.size(0), T = ids.size(1);
  const tensor::Tensor& params = model.flat_units().front().params;
  tensor::Tensor logits;
  for (int c = 0; c < model.num_chunks(); ++c) {
    const autograd::Variable hidden = receive_hidden(model, c, M, T);
    const autograd::Variable out =
        cache != nullptr ? model.forward_stage_cached(ids, hidden, c, *cache, /*last_only=*/true)
                         : model.forward_stage(ids, hidden, c);
    if (model.chunk_is_last(c)) {
      // [M, T or 1, padded_vocab / tp] -> the last positions, the whole vocabulary.
      tensor::Tensor last = out.data().select(1, out.data().size(1) - 1).contiguous();
      if (tp.enabled())
        last = autograd::gather_from_tp_region(autograd::Variable(last), tp.group).data();
      logits = last.to(DType::F32).contiguous();
    } else {
      links_.send_chunk_output(out.data())->wait();
    }
  }
  if (!logits.defined())
    logits = tensor::Tensor::empty({M, model.padded_vocab_size()}, DType::F32, params.device());
  pp_->broadcast(logits, links_.stages() - 1)->wait();
  return logits;
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
  auto schedule = std::make_unique<PipelineSchedule>(kind, pp, model.num_chunks());
  PipelineSchedule& ref = *schedule;
  engine.set_pipeline(std::move(schedule), std::move(sync));
  return ref;
}

}  // namespace strata::parallel
