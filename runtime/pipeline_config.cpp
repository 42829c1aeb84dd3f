#include "runtime/pipeline_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace strata::runtime {

void check_pipeline_config(const TrainConfig& c, const models::ModelShape& shape,
                           config::Reader& r) {
  // Note [Stage balance] (parallel/pipeline_stages.h): every stage needs a layer; an explicit
  // partition gives one layer count per stage, adding up to the model's layers.
  const ParallelismSection& p = c.parallelism;
  const int64_t pp = p.pipeline_parallel_size;
  if (pp > shape.n_layer)
    r.fail("pipeline_parallel_size",
           fmt::format("is {} but model '{}' has {} layers: every stage needs at least one "
                       "layer; use at most {} stages",
                       pp, c.model.name, shape.n_layer, shape.n_layer));
  if (!p.pipeline_partition.empty()) {
    const std::vector<int64_t>& part = p.pipeline_partition;
    if (static_cast<int64_t>(part.size()) != pp)
      r.fail("pipeline_partition",
             fmt::format("lists {} stages but pipeline_parallel_size is {}: give one layer count "
                         "per stage",
                         part.size(), pp));
    int64_t sum = 0;
    for (size_t s = 0; s < part.size(); ++s) {
      if (part[s] < 1)
        r.fail("pipeline_partition",
               fmt::format("gives stage {} {} layers: every stage needs at least one", s, part[s]));
      sum += part[s];
    }
    if (sum != shape.n_layer)
      r.fail("pipeline_partition",
             fmt::format("[{}] adds up to {} layers but model '{}' has {}", fmt::join(part, ", "),
                         sum, c.model.name, shape.n_layer));
  }
  // The interleaved schedule (Note [Virtual pipeline stages] in models/causal_lm.h): v > 1
  // exactly when pipeline_schedule is interleaved. That the micro-batches are a multiple of pp
  // is checked once the batch is resolved (runtime/trainer.cpp).
  const int64_t v = p.virtual_pipeline_stages;
  const bool interleaved = p.pipeline_schedule == "interleaved";
  if (v > 1 && !interleaved)
    r.fail("pipeline_schedule",
           fmt::format("is '{}' but virtual_pipeline_stages is {}: several chunks per stage run "
                       "only with pipeline_schedule: interleaved (or set "
                       "virtual_pipeline_stages: 1)",
                       p.pipeline_schedule, v));
  if (interleaved && v < 2)
    r.fail("virtual_pipeline_stages",
           fmt::format("is {} but pipeline_schedule is interleaved: give each stage at least 2 "
                       "chunks, or use pipeline_schedule: 1f1b",
                       v));
  if (interleaved && pp < 2)
    r.fail("virtual_pipeline_stages",
           fmt::format("is {} but pipeline_parallel_size is {}: the interleaved schedule needs "
                       "at least 2 stages",
                       v, pp));
  if (interleaved && !p.pipeline_partition.empty())
    r.fail("pipeline_partition",
           fmt::format("is given but pipeline_schedule is interleaved: its chunks are equal "
                       "(layers / (pipeline_parallel_size x virtual_pipeline_stages)); leave "
                       "pipeline_partition out"));
  if (interleaved && shape.n_layer % (pp * v) != 0)
    r.fail("virtual_pipeline_stages",
           fmt::format("{} x pipeline_parallel_size {} = {} chunks do not divide model '{}''s {} "
                       "layers: the interleaved schedule needs equal chunks",
                       v, pp, pp * v, c.model.name, shape.n_layer));
  // What a pipelined `train` does not do (docs/pipeline.md).
  if (pp > 1 && c.zero.stage == 3)
    r.fail("pipeline_parallel_size",
           fmt::format("is {} but zero_optimization.stage is 3: ZeRO-3 gathers and releases "
                       "parameters around each micro-batch, which a pipeline schedule "
                       "interleaves (docs/pipeline.md); use stage 0, 1 or 2",
                       pp));
}

}  // namespace strata::runtime
