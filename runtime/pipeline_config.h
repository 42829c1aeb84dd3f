#pragma once
// The checks of the train config's pipeline keys (parallelism.pipeline_*; docs/pipeline.md):
// layouts the model cannot split into stages and what a pipelined `train` does not run, each a
// user error naming the key and the numbers.
#include "core/config.h"
#include "models/registry.h"
#include "runtime/train_config.h"

namespace strata::runtime {

// `r` reads the `parallelism` section (its fail() names the file, line and key).
void check_pipeline_config(const TrainConfig& c, const models::ModelShape& shape,
                           config::Reader& r);

}  // namespace strata::runtime
