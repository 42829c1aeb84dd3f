#pragma once
// Checkpoints of a tensor- or pipeline-parallel run, in the single-process layout.
//
// Note [Tensor-parallel checkpoints]
// A checkpoint holds whole HF tensors in the flat-unit coordinates of the tp = 1 model (Note
// [Checkpoint layout]), whatever the layout that wrote it, so a run saved at one (tp, dp) resumes
// at another, and a tp = 1 run (or `convert`) reads it as its own. On save every rank first makes
// its local units whole over dp (each rank adds its owned slices into a zeroed unit buffer; one
// sum all-reduce, exact since the slices are disjoint), then the tp group puts each sharded
// parameter together (an all-gather, then the pieces back in place: Note [Tensor-parallel
// shards]); global rank 0 lays the whole tensors out in a tp = 1 model of the same config (the
// "whole" model) and writes the checkpoint as one process would, and the world agrees on
// success. On load every rank reads the whole tensors it needs from that layout and keeps its
// slices. The whole model is built for the occasion: host memory for one more copy of the
// model's parameters.
// The optimizer states go a unit at a time (Note [Streamed shards] in parallel/engine.h): every
// rank streams its slices of one unit (on NVMe, that unit's sub-groups alone), the unit is made
// whole over dp and tp, and rank 0 hands each state of the whole unit to the checkpoint's
// streaming writer before the next unit; every rank goes through the same units even when rank
// 0's writer failed, so the collectives stay matched. A load keeps one unit of this rank's
// states (TpCheckpointReader). So host memory holds the whole model's parameters and a few
// units' states, never the optimizer states whole.
//
// Under pipeline parallelism (Note [Pipeline stages]) a rank's units are its stage's, named as
// in the whole model. On save the first rank of each stage's tp and dp groups (its "stage lead")
// lays its stage's whole tensors out in a whole model of its own, zeros elsewhere, and the stage
// leads (one pp group) sum each whole unit's buffers, parameters and states, onto global rank 0:
// exact, since the stages hold disjoint tensors. The copy of a tied embedding on the last stage
// is left out (it equals the first stage's: the pipeline sums its gradients), so it is written
// once. The stage leads go through the whole model's units in its order, each summing a unit's
// states (zeros where the stage holds none) before the next.
// On load each stage reads the tensors of its own parameters by name, the tied copy included.
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "parallel/engine.h"
#include "runtime/checkpoint.h"

namespace strata::runtime {

struct TpCheckpointContext {
  models::CausalLM& model;  // this rank's tensor-parallel model
  parallel::Engine& engine;
  comm::Communicator& world;
  // Builds the tp = 1, pp = 1 model of the same config (its values are overwritten).
  std::function<std::unique_ptr<models::CausalLM>()> make_whole;
  // This rank's pipeline (one rank per stage); null or of size 1 without pipeline parallelism.
  comm::Communicator* pp = nullptr;
};

// Collective over the world. Returns the checkpoint directory on every rank.
std::string save_tp_checkpoint(const TpCheckpointContext& ctx, const std::string& run_dir,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep);

// Fills `dst` ([begin, begin + dst.numel()) of this rank's unit `unit`, state `key`) from a
// checkpoint indexed against the whole model: the inverse of the save. `source_key` maps a key to
// the one to read ("param" or "master" for parameters).
class TpCheckpointReader {
 public:
  TpCheckpointReader(const models::CausalLM& local, const models::CausalLM& whole,
                     const FlatShardIndex& index);
  void fill(const std::string& unit, const std::string& key, const std::string& source_key,
            int64_t begin, tensor::Tensor dst);

 private:
  struct Place {
    std::string unit;
    int64_t offset = 0;
    tensor::Shape shape;
  };
  const models::CausalLM& local_;
  const FlatShardIndex& index_;
  std::map<std::string, Place> whole_places_;  // parameter name -> where in the whole model
  // key -> this rank's whole unit `cached_unit_` of that state; a fill of another unit drops it.
  std::string cached_unit_;
  std::map<std::string, tensor::Tensor> unit_cache_;
};

}  // namespace strata::runtime
