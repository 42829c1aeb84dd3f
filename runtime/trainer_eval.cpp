// The Trainer's looks at the model between steps: the validation loss and the text samples the
// log shows. Both run the model in eval mode without gradients on every rank; under pipeline
// parallelism the validation batches and the sampling steps flow through the stages.
#include <fmt/format.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"
#include "data/unicode.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/trainer.h"
#include "sampling/sampler.h"
#include "tensor/cuda.h"

namespace strata::runtime {

float Trainer::evaluate() {
  if (!val_data_) return NAN;
  autograd::NoGradGuard no_grad;
  model_->eval();
  const int64_t M = config_.batch.micro_batch_size;
  double sum = 0.0;
  int64_t n = std::max<int64_t>(1, config_.training.eval_batches);
  for (int64_t i = 0; i < n; ++i) {
    data::Batch batch = val_data_->batch(i * M, M);
    const tensor::Tensor ids = batch.ids.to(device_), targets = batch.targets.to(device_);
    // Under pipeline parallelism the batch flows through the stages; every stage gets the loss.
    sum +=
        static_cast<double>(pipeline_ ? pipeline_->forward_loss(*model_, ids, targets).item<float>()
                                      : model_->loss(ids, targets).item());
  }
  model_->train();
  return static_cast<float>(sum / static_cast<double>(n));
}

std::string Trainer::sample_text() {
  std::vector<int32_t> prompt;
  if (!config_.training.sample_prompt.empty()) {
    prompt = tokenizer_->encode(config_.training.sample_prompt);
  }
  if (prompt.empty()) {
    const data::DataLoader& d = val_data_ ? *val_data_ : *train_data_;
    prompt.push_back(static_cast<int32_t>(tensor::to_int_vector(d.batch(0, 1).ids)[0]));
  }
  sampling::SampleOptions so;
  so.max_new_tokens = config_.training.sample_tokens;
  so.temperature = config_.training.temperature;
  so.top_k = config_.training.top_k;
  so.top_p = config_.training.top_p;
  so.seed = config_.run.seed + static_cast<uint64_t>(step_);
  // Every sampled token lengthens the sequence, so each forward is a new GEMM shape: not tuned
  // (Note [cuBLASLt tuning]).
  const tensor::CudaMatmulTuningPause no_tuning;
  // Every rank samples (Note [Sampling over ranks] in sampling/sampler.h); under pipeline
  // parallelism the steps run through the stages.
  sampling::StepForward through_stages;
  if (pipeline_ != nullptr)
    through_stages = [this](const tensor::Tensor& ids, models::KvCache* cache) {
      return pipeline_->forward_last_logits(*model_, ids, cache);
    };
  std::vector<int32_t> out = sample(*model_, prompt, so, through_stages);
  return tokenizer_->decode(out);
}

std::string Trainer::sample_event() {
  std::string text;
  try {
    text = sample_text();
  } catch (const UserError& e) {
    // A diverged run trains on (its loss event says so); its sample has nothing to draw from.
    return fmt::format("sample at step {} skipped: {}", step_, e.what());
  }
  return fmt::format("sample at step {}:\n{}\n---", step_, data::unicode::printable(text));
}

}  // namespace strata::runtime
