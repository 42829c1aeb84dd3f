#pragma once
// The sum of one double over the ranks of a communicator, the same bits on every rank (for the
// global gradient norm and the logged mean loss).
#include "comm/communicator.h"
#include "core/device.h"

namespace strata::parallel {

// Doubles cannot travel as tensors (no f64 dtype): allgathers their bits and adds them up in rank
// order, so every rank computes the same sum from the same values (docs/design.md decision 9). The
// tensors live on `device` (what an nccl communicator serves). Collective.
double sum_over_ranks(comm::Communicator& comm, double x, Device device);

}  // namespace strata::parallel
