#pragma once
// Training checkpoints: model weights, optimizer state, trainer state and the resolved config.
//
// Note [Checkpoint layout]
//   run_dir/checkpoints/step_00000200/model.safetensors      every parameter by name
//                                    /optimizer.safetensors  Optimizer::state_dict() tensors
//                                    /trainer_state.json     TrainerState
//                                    /config.yaml            the resolved config text
//   run_dir/checkpoints/latest                               one line: "step_00000200"
// model.safetensors holds each parameter under its full name (HF GPT-2 names for gpt2) in
// Strata's layout (Linear weights [out, in], Note [Linear layout]; wte with its padding rows),
// fp32, exactly the bytes of the flat buffers; its metadata names the family and the layout.
// It is NOT an HF file: `convert --to-hf` writes one (models/hf_interop.h).
// optimizer.safetensors has the optimizer's name and step count in its metadata.
//
// Note [Atomic checkpoints]
// Nothing is ever half-written (docs/design.md decision 12). A step directory is written under a
// temporary name "step_N.tmp.<pid>", every file and the directory are fsynced, then it is renamed
// into place (re-saving an existing step swaps the two directories atomically with
// renameat2(RENAME_EXCHANGE) and deletes the old one). `latest` is replaced the same way, and
// only after the step directory is in place, so it never names a checkpoint that is not
// complete. A failure removes the temporary directory and leaves earlier checkpoints as they
// were. Loading validates every file before it touches the model or the optimizer.
//
// Note [Checkpoint digests]
// A checkpoint that was written whole can still be damaged later (bit rot, a copy cut short, a
// hand edit), and a damaged value would load without a word: a resumed run would train from
// other weights, or at another step. So every file carries a digest: the safetensors files in
// their metadata (Note [Safetensors digests]), trainer_state.json as its last key "digest" (the
// checksum of the file's own text written without it, two-space indented, so a changed value
// fails and a file re-indented by hand does too). Loading checks trainer_state.json's digest
// first; when it has one, every safetensors file of the checkpoint must have digests (a file
// without them was replaced), and their headers are checked when opened. load_checkpoint streams
// every tensor through its digest before it touches the model (one more read of the files);
// a Trainer's resume (open_checkpoint, then FlatShardIndex::fill on each rank) checks each tensor
// as it reads it (one read in parts, streamed once before its first part is used), so a rank
// reads only the files it loads from. Checkpoints written before digests
// (no "digest" in trainer_state.json) load unchecked. config.yaml and `latest` carry none:
// a resume runs the config it is given, and `latest` only names a directory.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "runtime/checkpoint_shards.h"

namespace strata::runtime {

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  int64_t samples_consumed =
      0;                  // data position (global samples, see the data loader's Note [Data order])
  uint64_t rng_seed = 0;  // autograd::current_generator() state (dropout), autograd/rng_context.h
  uint64_t rng_offset = 0;
  double loss_scale = 0.0;  // fp16 dynamic loss scale (0 when unused)
  // The rest of optim::LossScalerState, so an fp16 run resumes bitwise (optional in the file:
  // absent in checkpoints written before they existed).
  int64_t loss_scale_iteration = 0;
  int64_t loss_scale_last_overflow = -1;
  int loss_scale_hysteresis_left = 0;
  std::string model_name;  // registry name, checked on load
  // Read back: trainer_state.json carried a digest, so its safetensors files must carry theirs
  // (Note [Checkpoint digests]). Every checkpoint written now has one.
  bool digests = false;
};

// Writes run_dir/checkpoints/step_<state.step, 8 digits>/ and points `latest` at it (Note
// [Checkpoint layout], Note [Atomic checkpoints]). `optimizer` may be null (no
// optimizer.safetensors then). Keeps the newest `keep` step directories by step number (0 = all;
// the one just written is always kept). Returns the checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, const models::CausalLM& model,
                            const optim::Optimizer* optimizer, const TrainerState& state,
                            const std::string& config_yaml, int64_t keep);

// The checkpoint `latest` points at, if any: nullopt when run_dir/checkpoints/latest does not
// exist and there are no step_* directories; a user_error naming it when it is unreadable,
// malformed or dangling, or missing beside step_* directories (a new run would replace them).
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir);

// A checkpoint directory given either itself or a run directory (then its latest); a user_error
// when `path` is neither.
std::string resolve_checkpoint(const std::string& path);

// Validates everything before touching the model: files present, safetensors well-formed, every
// parameter present with the right shape and dtype (and nothing else), the family matching,
// optimizer state names/sizes matching, and, when `expected_model_name` is not empty, the model
// name. Errors name the file and what differs. Then loads the weights in place (exact bytes:
// resume is bitwise) and, when `optimizer` is not null, its state. The caller restores the
// generator from the returned rng_seed/rng_offset.
TrainerState load_checkpoint(const std::string& checkpoint_dir, models::CausalLM& model,
                             optim::Optimizer* optimizer /* nullable: weights only */,
                             std::string_view expected_model_name = {});

// The path of the resolved config.yaml stored in a checkpoint directory (for generate/convert);
// a user_error when it is missing.
std::string checkpoint_config_path(const std::string& checkpoint_dir);

// Checks a checkpoint's files without a model (`convert --verify`; Note [Checkpoint digests]):
// trainer_state.json (and its digest), then every *.safetensors file of the directory, each
// header and each tensor streamed through its digest. A user_error naming the first damaged
// file (and tensor). `digests` is false for a checkpoint written before digests: then only the
// files' structure was checked.
struct CheckpointCheck {
  bool digests = false;
  int64_t files = 0;  // safetensors files read
  int64_t tensors = 0;
  uint64_t bytes = 0;  // tensor bytes read
};
CheckpointCheck verify_checkpoint(const std::string& checkpoint_dir);

// Note [Distributed checkpoints]
// With data parallelism every rank takes part in a checkpoint. Rank 0 creates the temporary step
// directory and tells the others its name; each rank writes its own files into it:
//   rank 0:   trainer_state.json, config.yaml, and model.safetensors when the parameters are
//             whole on every rank (one process, plain DP, ZeRO-1/2);
//   rank r:   model.rank<r>-of-<n>.safetensors (ZeRO-3: its slices of the parameters) and
//             optimizer.rank<r>-of-<n>.safetensors (its slices of the optimizer state; with one
//             rank the file is optimizer.safetensors) — shard files, Note [Flat shards].
// Then every rank reports success (an allreduce); only when all succeeded does rank 0 fsync,
// rename the directory into place and rewrite `latest` (Note [Atomic checkpoints]); otherwise it
// removes the temporary directory and every rank raises the error. A checkpoint loads into any
// data-parallel layout: open_checkpoint indexes whatever files are there, and each rank fills
// the slices it owns now (re-partitioning when the dp size or ZeRO stage changed). The run
// directory must be on a file system every rank sees.
// The parameters of a model as whole tensors produced in pieces: produce(emit) calls emit(i,
// piece) with the next piece.numel() elements of the model's i-th parameter (flat units in
// order, each unit's parameters in order: model.safetensors's order), each parameter's pieces in
// order and all of them.
using ModelStream = std::function<void(const FlatShardStream::Emit&)>;

struct CheckpointParts {
  const models::CausalLM* model = nullptr;  // written whole as model.safetensors when write_model
  bool write_model = false;
  // When set (with write_model), model.safetensors takes its bytes from here as they come (Note
  // [Streamed safetensors]), written before the optimizer files; `model` then only gives the
  // layout (it may be built deferred: Note [Deferred initialisation]).
  ModelStream model_stream;
  std::vector<FlatShard> param_shards;      // ZeRO-3: this rank's slices of the parameters
  std::vector<FlatShard> optimizer_shards;  // this rank's slices of the optimizer state
  // The same, streamed (Note [Streamed shards] in parallel/engine.h): used when the vector
  // beside it is empty.
  FlatShardStream param_stream;
  FlatShardStream optimizer_stream;
  std::string optimizer_name;  // Optimizer::name(), stored in the metadata
  int64_t optimizer_step = 0;
};

// Collective over `comm` (Note [Distributed checkpoints]). `state` and `config_yaml` are used on
// rank 0. Returns the checkpoint directory on every rank. The shards may live on a GPU (they are
// written from host copies); `device` is where the ranks' small agreement tensors travel: the
// run's device, what an nccl `comm` serves.
std::string save_checkpoint(const std::string& run_dir, const CheckpointParts& parts,
                            const TrainerState& state, const std::string& config_yaml, int64_t keep,
                            comm::Communicator& comm, Device device = Device::cpu());

struct OpenedCheckpoint {
  std::string dir;
  TrainerState state;
  std::string optimizer_name;  // empty when the checkpoint holds no optimizer state
  int64_t optimizer_step = 0;
  std::unique_ptr<FlatShardIndex> index;  // parameters ("param") and optimizer states
};

// Validates trainer_state.json (and the model name when given), indexes every model and
// optimizer file of the checkpoint against `model`'s flat units, and checks that the optimizer
// files agree on the optimizer and its step. Touches no model or optimizer.
OpenedCheckpoint open_checkpoint(const std::string& checkpoint_dir, const models::CausalLM& model,
                                 std::string_view expected_model_name = {});

}  // namespace strata::runtime
