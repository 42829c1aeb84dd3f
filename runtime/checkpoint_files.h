#pragma once
// What the single-process and the distributed checkpoint writers share (runtime/checkpoint.cpp,
// runtime/checkpoint_distributed.cpp): a step directory's file names and the file-system steps
// of an atomic checkpoint (Note [Atomic checkpoints] in runtime/checkpoint.h).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "runtime/checkpoint.h"
#include "tensor/safetensors.h"

namespace strata::runtime::checkpoint_files {

inline constexpr std::string_view kModelFile = "model.safetensors";
inline constexpr std::string_view kOptimizerFile = "optimizer.safetensors";
inline constexpr std::string_view kStateFile = "trainer_state.json";
inline constexpr std::string_view kConfigFile = "config.yaml";
inline constexpr std::string_view kLatest = "latest";
inline constexpr std::string_view kStepPrefix = "step_";

std::string join(const std::string& dir, std::string_view name);
void fsync_path(const std::string& path, bool directory);
// Writes `text` to `path` through a temporary file, fsync and rename.
void write_text_atomic(const std::string& path, const std::string& text);
std::string step_dir_name(int64_t step);
// Moves `tmp` to `final_dir`, atomically replacing an existing one (Note [Atomic checkpoints]).
void publish_directory(const std::string& tmp, const std::string& final_dir);
// Removes the oldest step directories beyond `keep`, never `current`.
void prune(const std::string& root, int64_t keep, const std::string& current);
TrainerState read_trainer_state(const std::string& path);
// dir/name, which must exist: a UserError naming the incomplete checkpoint otherwise.
std::string require_file(const std::string& dir, std::string_view name);
// A step directory's files: the model's parameters, the optimizer's state (when given) and the
// trainer files (trainer_state.json, config.yaml), with digests (Note [Checkpoint layout]).
void write_step_directory(const std::string& dir, const models::CausalLM& model,
                          const optim::Optimizer* optimizer, const TrainerState& state,
                          const std::string& config_yaml);
// model.safetensors's metadata (Note [Checkpoint layout]).
std::map<std::string, std::string> model_file_metadata(const models::CausalLM& model,
                                                       const TrainerState& state);
// model.safetensors of `model`'s layout (write_step_directory's names, shapes, dtypes and order;
// `model` may be built deferred, its storage released), the bytes from `produce` as they come
// (Note [Streamed safetensors]): the same file write_step_directory writes for the same values.
void write_model_file(const std::string& dir, const models::CausalLM& model,
                      const TrainerState& state, const ModelStream& produce);
// trainer_state.json (with its digest) and config.yaml.
void write_trainer_files(const std::string& dir, const TrainerState& state,
                         const std::string& config_yaml);
// Note [Checkpoint digests]: a checkpoint whose trainer_state.json has a digest was written with
// digests in every file; `r` without them is refused, naming the file.
void require_digests(const tensor::SafetensorsReader& r, const TrainerState& state,
                     const std::string& dir);

}  // namespace strata::runtime::checkpoint_files
