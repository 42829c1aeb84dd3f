#pragma once
// Checkpoints of a tensor- or pipeline-parallel run, in the single-process layout.
//
// Note [Tensor-parallel checkpoints]
// A checkpoint holds whole HF tensors in the flat-unit coordinates of the tp = 1 model (Note
// [Checkpoint layout]), whatever the layout that wrote it, so a run saved at one (tp, dp) resumes
// at another, and a tp = 1 run (or `convert`) reads it as its own. No rank ever holds the whole
// model: the tp = 1 model (the "whole" model) is built deferred (Note [Deferred initialisation]
// in models/nn/module.h), its names, shapes and offsets without storage, and everything goes a
// whole unit at a time.
// On save the world goes through the whole model's units in its order, twice: the parameters
// into model.safetensors, then the optimizer states (Note [Streamed shards] in parallel/engine.h)
// into the optimizer file. For each unit every rank first makes its local unit whole over dp
// (each rank adds its owned slices, streamed — on NVMe that unit's sub-groups alone — into a
// zeroed unit buffer; one sum all-reduce, exact since the slices are disjoint; parameters that are
// not partitioned are whole already), then the tp group puts each sharded tensor together (an
// all-gather, then the pieces back in place: Note [Tensor-parallel shards]) and global rank 0
// places the whole tensors in a whole-unit buffer per key and hands them to the file's streaming
// writer (Note [Streamed safetensors]: its header is fixed by the whole model's names, shapes
// and dtypes, so the bytes are those one process writes) before the next unit. Every rank goes
// through the same units even when rank 0's writer failed, so the collectives stay matched, and
// the world agrees on success.
// On load every rank reads only its slices from the files (read_slice: a row shard one range per
// block, a column shard whole rows a bounded chunk at a time), one local unit of one key at a
// time (TpCheckpointReader). So host memory holds a unit's whole buffers and one tensor's
// temporaries, never the model's parameters or its optimizer states.
//
// Under pipeline parallelism (Note [Pipeline stages]) a rank's units are its stage's, named as
// in the whole model. The first rank of each stage's tp and dp groups (its "stage lead") fills
// the whole-unit buffers of the units its stage holds, zeros for the others, and the stage
// leads (one pp group) sum each whole unit's buffers onto global rank 0: exact, since the stages
// hold disjoint tensors. The copy of a tied embedding on the last stage is left out (it equals
// the first stage's: the pipeline sums its gradients), so it is written once.
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
  // Builds the tp = 1, pp = 1 model of the same config; called inside a DeferredInitScope, so
  // it gives the layout alone.
  std::function<std::unique_ptr<models::CausalLM>()> make_whole;
  // This rank's pipeline (one rank per stage); null or of size 1 without pipeline parallelism.
  comm::Communicator* pp = nullptr;
};

// Collective over the world. Returns the checkpoint directory on every rank.
std::string save_tp_checkpoint(const TpCheckpointContext& ctx, const std::string& run_dir,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep);

// Fills `dst` ([begin, begin + dst.numel()) of this rank's unit `unit`, state `key`) from a
// checkpoint indexed against the whole model: the inverse of the save, reading this rank's slices
// only (read_slice); `whole` gives the layout (build it deferred). `source_key` maps a key to the
// one to read ("param" or "master" for parameters).
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

// This rank's slice (nn::shard_of's, Note [Tensor-parallel shards]; the whole tensor when
// replicated) of a whole tensor of shape `full` stored at elements [offset, offset +
// full.numel()) of (unit, key) in `index`, into `dst` (F32, contiguous, host, the slice's size),
// reading only the slice (nn::read_shard).
void read_slice(const FlatShardIndex& index, const std::string& unit, const std::string& key,
                int64_t offset, const tensor::Shape& full, const models::nn::ShardSpec& spec,
                int rank, int size, tensor::Tensor dst,
                int64_t chunk = models::nn::kShardReadChunk);

}  // namespace strata::runtime
