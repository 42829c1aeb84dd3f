#pragma once
// Activation checkpointing.
//
// Note [Activation checkpointing]
// `checkpoint(fn, inputs)` runs fn without building a graph, keeping only `inputs`. In backward
// it re-runs fn with grad on (from detached copies of the inputs), back-propagates the incoming
// gradients through the fresh graph — parameters used inside accumulate their gradients as usual
// — and passes the inputs' gradients on. Random draws replay exactly: the thread's RNG generator
// (see rng_context.h) is rewound to where it was for the first run.
//
// Note [CPU checkpointing]
// ZeRO-Infinity's (and DeepSpeed's `activation_checkpointing.cpu_checkpointing`) offload of the
// checkpoints: with cpu_checkpointing on, the inputs a checkpoint keeps for its replay are copied
// from the GPU into pinned host memory (Tier::Pinned, Category::Activation) when the forward
// runs, so the device holds none of them between forward and backward; the backward copies them
// back to the device (charged to Category::Activation there) just before the replay and drops
// them after. A copy is exact, so the replay computes the same bits as with the inputs kept on
// the device. Inputs already in host memory (a CPU run: the host plays the device) are kept as
// they are: the setting changes nothing there. The copies are synchronous on the compute stream.
#include <functional>
#include <vector>

#include "autograd/variable.h"

namespace strata::autograd {

using CheckpointFn = std::function<std::vector<Variable>(const std::vector<Variable>&)>;

std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs);

// Note [CPU checkpointing]: process-wide, off by default; read when a checkpoint's forward runs.
void set_cpu_checkpointing(bool on);
bool cpu_checkpointing();

// Sets cpu_checkpointing for its lifetime and restores the setting before.
class CpuCheckpointingScope {
 public:
  explicit CpuCheckpointingScope(bool on) : saved_(cpu_checkpointing()) {
    set_cpu_checkpointing(on);
  }
  ~CpuCheckpointingScope() { set_cpu_checkpointing(saved_); }
  CpuCheckpointingScope(const CpuCheckpointingScope&) = delete;
  CpuCheckpointingScope& operator=(const CpuCheckpointingScope&) = delete;

 private:
  bool saved_;
};

}  // namespace strata::autograd
