#pragma once
// Pipeline stages: how the model's layer stack is split into `pp` contiguous stages (Note
// [Pipeline stages] in models/causal_lm.h), and the checks on a pipeline layout.
//
// Note [Stage balance]
// By default the stages are balanced by parameter count: the first stage holds its layers plus
// the embeddings, the last its layers plus the final norm and head (and a tied embedding's
// copy), a middle stage its layers alone; the split minimises the largest stage (ties: the
// earliest stages take fewer layers), every stage holding at least one layer. An explicit list
// (parallelism.pipeline_partition) gives each stage's layer count instead.
#include <cstdint>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "models/registry.h"

namespace strata::parallel {

// Layers per stage, summing to the model's layer count.
struct StagePartition {
  std::vector<int64_t> layers;

  int size() const { return static_cast<int>(layers.size()); }
  // Stage s's layers [begin, end) of the whole stack.
  models::StageLayers stage(int s) const;
  // Parameters stage s holds, from `shape` (Note [Stage balance]).
  int64_t parameters(const models::ModelShape& shape, int s) const;
  // "stage 0: layers 0-3 (1.2M parameters), stage 1: ..." for logs.
  std::string describe(const models::ModelShape& shape) const;
};

// Note [Stage balance]. strata::user_error when there are more stages than layers or pp < 1.
StagePartition balance_stages(const models::ModelShape& shape, int pp);

// An explicit list of layers per stage: strata::user_error (naming
// parallelism.pipeline_partition) unless it has pp entries, each >= 1, summing to n_layer.
StagePartition explicit_stages(const std::vector<int64_t>& layers, int64_t n_layer, int pp);

// Note [Virtual pipeline stages] (models/causal_lm.h): rank `rank`'s v chunks when the n_layer
// layers form pp x v equal chunks. strata::user_error naming
// parallelism.virtual_pipeline_stages unless pp x v divides n_layer.
models::StageLayers interleaved_stage(int64_t n_layer, int pp, int v, int rank);
// "rank 0: layers 0-0, 2-2 (1.2M parameters), rank 1: ..." for logs.
std::string describe_interleaved(const models::ModelShape& shape, int pp, int v);

// The layout checks of a pipeline run: pp >= 1, tp >= 1 and tp x pp dividing the world (world =
// tp x pp x dp), with a user error that names the sizes otherwise.
void check_pipeline_layout(int world_size, int tp, int pp);

}  // namespace strata::parallel
