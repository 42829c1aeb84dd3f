#pragma once
// Optimizer parameter groups over flat units: one group per unit (docs/design.md decision 4), or
// per owned slice of a unit (ZeRO, Note [ZeRO partitions]).
//
// Which parameters decay: matrices (and the embeddings, as in GPT-2/llm.c) do; biases, norm
// weights and other 1-D parameters do not (Note [Segments and weight decay] in
// optim/optimizer.h). Padding lies in no segment, so it stays put.
#include <vector>

#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "parallel/partition.h"

namespace strata::parallel {

// The unit's parameters as segments, clipped to `slice` of the flat buffer and with offsets
// relative to slice.begin (whole unit when slice is empty/default). Parameters outside the slice
// are left out; a parameter cut by a slice boundary keeps its name and decay flag.
std::vector<optim::Segment> unit_segments(const models::FlatUnit& unit, Range slice = {});

// A group over `slice` of the unit's own flat buffers (views, not copies).
optim::ParamGroup unit_param_group(const models::FlatUnit& unit, Range slice = {});

// One group per unit over its whole buffers: the single-process (and plain DP) optimizer.
std::vector<optim::ParamGroup> unit_param_groups(models::CausalLM& model);

}  // namespace strata::parallel
