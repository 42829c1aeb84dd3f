#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/unicode.h"
#include "offload/checksum.h"
#include "runtime/checkpoint_files.h"
#include "tensor/safetensors.h"

namespace strata::runtime {

// What checkpoint_distributed.cpp shares with this file (runtime/checkpoint_files.h) and the
// helpers only this file uses.
namespace checkpoint_files {

namespace fs = std::filesystem;
using nlohmann::json;
using tensor::SafetensorsEntry;
using tensor::SafetensorsReader;
using tensor::Tensor;

std::string join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) user_error("{}: cannot open to fsync ({})", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) user_error("{}: fsync failed ({})", path, std::strerror(err));
}

// Writes `text` to `path` through a temporary file, fsync and rename.
void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomically(path, text);  // Note [Atomic files]
}

std::string step_dir_name(int64_t step) {
  return fmt::format("{}{:08d}", kStepPrefix, step);
}

// The step of a "step_<digits>" name, if it is one.
std::optional<int64_t> parse_step_dir(std::string_view name) {
  if (!name.starts_with(kStepPrefix) || name.size() == kStepPrefix.size()) return std::nullopt;
  int64_t step = 0;
  const char* begin = name.data() + kStepPrefix.size();
  const char* end = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end || step < 0) return std::nullopt;
  return step;
}

// Moves `tmp` to `final_dir`, atomically replacing an existing one (Note [Atomic checkpoints]).
void publish_directory(const std::string& tmp, const std::string& final_dir) {
  if (!fs::exists(final_dir)) {
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      user_error("{}: cannot rename {} into place ({})", final_dir, tmp, std::strerror(errno));
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp);  // now holds the replaced checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    user_error("{}: cannot swap in {} ({})", final_dir, tmp, std::strerror(errno));
  // Filesystems without RENAME_EXCHANGE: a short window in which the step directory is absent,
  // but `latest` is rewritten only afterwards and never names a partial directory.
  const std::string old = fmt::format("{}.tmp.{}.old", final_dir, ::getpid());
  fs::remove_all(old);
  if (::rename(final_dir.c_str(), old.c_str()) != 0)
    user_error("{}: cannot move the old checkpoint aside ({})", final_dir, std::strerror(errno));
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), final_dir.c_str());
    user_error("{}: cannot rename {} into place ({})", final_dir, tmp, std::strerror(err));
  }
  fs::remove_all(old);
}

void write_trainer_files(const std::string& dir, const TrainerState& state,
                         const std::string& config_yaml);

std::map<std::string, std::string> model_file_metadata(const models::CausalLM& model,
                                                       const TrainerState& state) {
  return {{"format", "strata"},
          {"family", model.family()},
          {"model_name", state.model_name},
          {"layout", "strata: Linear weights [out, in], padded vocabulary; not an HF file"}};
}

void write_model_file(const std::string& dir, const models::CausalLM& model,
                      const TrainerState& state, const ModelStream& produce) {
  // The specs of write_step_directory's tensors, in its order: the same header, so the same bytes.
  std::vector<tensor::SafetensorsSpec> specs;
  for (const models::FlatUnit& u : model.flat_units())
    for (size_t k = 0; k < u.names.size(); ++k)
      specs.push_back({u.names[k], u.variables[k].data().dtype(), u.shapes[k]});
  STRATA_CHECK(!specs.empty(), "model has no flat units");
  tensor::SafetensorsWriter writer(join(dir, kModelFile), std::move(specs),
                                   model_file_metadata(model, state));
  produce([&](size_t i, const Tensor& piece) { writer.append(i, piece); });
  writer.commit();
}

void write_step_directory(const std::string& dir, const models::CausalLM& model,
                          const optim::Optimizer* optimizer, const TrainerState& state,
                          const std::string& config_yaml) {
  // Note [Checkpoint layout]: the parameter views, i.e. the flat buffers' bytes.
  std::vector<std::pair<std::string, Tensor>> params;
  for (const models::FlatUnit& u : model.flat_units())
    for (size_t k = 0; k < u.names.size(); ++k)
      params.emplace_back(u.names[k], u.variables[k].data());
  STRATA_CHECK(!params.empty(), "model has no flat units");
  tensor::save_safetensors(join(dir, kModelFile), params, model_file_metadata(model, state));
  if (optimizer != nullptr) {
    optim::OptimizerState s = optimizer->state_dict();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const optim::NamedTensor& t : s.tensors) tensors.emplace_back(t.name, t.tensor);
    tensor::save_safetensors(join(dir, kOptimizerFile), tensors,
                             {{"format", "strata"},
                              {"optimizer", std::string(optimizer->name())},
                              {"step", std::to_string(s.step)}});
  }
  write_trainer_files(dir, state, config_yaml);
}

void write_trainer_files(const std::string& dir, const TrainerState& state,
                         const std::string& config_yaml) {
  nlohmann::ordered_json j;
  j["format"] = "strata-trainer-state";
  j["version"] = 1;
  j["step"] = state.step;
  j["samples_consumed"] = state.samples_consumed;
  j["rng_seed"] = state.rng_seed;
  j["rng_offset"] = state.rng_offset;
  j["loss_scale"] = state.loss_scale;
  if (state.loss_scale > 0) {
    j["loss_scale_iteration"] = state.loss_scale_iteration;
    j["loss_scale_last_overflow"] = state.loss_scale_last_overflow;
    j["loss_scale_hysteresis_left"] = state.loss_scale_hysteresis_left;
  }
  j["model_name"] = state.model_name;
  const std::string body = j.dump(2);
  j["digest"] = fmt::format("{:016x}", offload::checksum64(body.data(), body.size()));
  write_text_atomic(join(dir, kStateFile), j.dump(2) + "\n");
  write_text_atomic(join(dir, kConfigFile), config_yaml);
  fsync_path(dir, true);
}

// Removes the oldest step directories beyond `keep`, never `current`.
void prune(const std::string& root, int64_t keep, const std::string& current) {
  if (keep == 0) return;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (auto step = parse_step_dir(name); step && e.is_directory() && name != current)
      steps.emplace_back(*step, name);
  }
  std::sort(steps.begin(), steps.end());
  const int64_t remove = static_cast<int64_t>(steps.size()) - (keep - 1);
  for (int64_t i = 0; i < remove; ++i) {
    // Rename first so a crash mid-delete never leaves a partial directory under a step name.
    const std::string victim = join(root, steps[static_cast<size_t>(i)].second);
    const std::string trash = fmt::format("{}.tmp.{}.old", victim, ::getpid());
    if (::rename(victim.c_str(), trash.c_str()) != 0)
      user_error("{}: cannot remove old checkpoint ({})", victim, std::strerror(errno));
    fs::remove_all(trash);
  }
}

template <typename Json>
int64_t json_int(const Json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_number_integer())
    user_error("{}: '{}' is missing or not an integer", path, key);
  return j[key].template get<int64_t>();
}

template <typename Json>
uint64_t json_uint(const Json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_number_unsigned())
    user_error("{}: '{}' is missing or not a non-negative integer", path, key);
  return j[key].template get<uint64_t>();
}

TrainerState read_trainer_state(const std::string& path) {
  // Parsed in file order: the digest is over the text written without it (Note [Checkpoint
  // digests]).
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(read_whole_file(path), nullptr,
                                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    user_error("{}: not valid JSON; the checkpoint is corrupt", path);
  TrainerState s;
  if (j.contains("digest")) {
    uint64_t want = 0;
    const auto& d = j["digest"];
    const std::string hex = d.is_string() ? d.get<std::string>() : std::string();
    const auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), want, 16);
    if (hex.size() != 16 || ec != std::errc() || ptr != hex.data() + hex.size())
      user_error("{}: 'digest' is not a 16-digit hex checksum; the checkpoint is corrupt", path);
    j.erase("digest");
    const std::string body = j.dump(2);
    if (offload::checksum64(body.data(), body.size()) != want)
      user_error(
          "{}: does not match the digest written with it: the file was damaged or changed after "
          "it was written (Note [Checkpoint digests]); restore it, or use another checkpoint",
          path);
    s.digests = true;
  }
  s.step = json_int(j, "step", path);
  s.samples_consumed = json_int(j, "samples_consumed", path);
  s.rng_seed = json_uint(j, "rng_seed", path);
  s.rng_offset = json_uint(j, "rng_offset", path);
  if (!j.contains("loss_scale") || !j["loss_scale"].is_number())
    user_error("{}: 'loss_scale' is missing or not a number", path);
  s.loss_scale = j["loss_scale"].get<double>();
  if (j.contains("loss_scale_iteration")) {
    s.loss_scale_iteration = json_int(j, "loss_scale_iteration", path);
    s.loss_scale_last_overflow = json_int(j, "loss_scale_last_overflow", path);
    s.loss_scale_hysteresis_left =
        static_cast<int>(json_int(j, "loss_scale_hysteresis_left", path));
  }
  if (!j.contains("model_name") || !j["model_name"].is_string())
    user_error("{}: 'model_name' is missing or not a string", path);
  s.model_name = j["model_name"].get<std::string>();
  if (s.step < 0 || s.samples_consumed < 0)
    user_error("{}: step and samples_consumed must not be negative", path);
  return s;
}

// Note [Checkpoint digests]: a checkpoint whose trainer_state.json has a digest was written with
// digests in every file.
void require_digests(const SafetensorsReader& r, const TrainerState& state,
                     const std::string& dir) {
  if (state.digests && !r.has_digests())
    user_error(
        "{}: has no digests, but {} was written with them: the file was replaced or damaged after "
        "the checkpoint was written (Note [Checkpoint digests]); restore it, or use another "
        "checkpoint",
        r.path(), join(dir, kStateFile));
}

std::string require_file(const std::string& dir, std::string_view name) {
  std::string path = join(dir, name);
  if (!fs::is_regular_file(path))
    user_error("{}: missing from checkpoint {}; the checkpoint is incomplete or not a checkpoint",
               path, dir);
  return path;
}

// Checks that `reader` holds exactly `expected` (name -> shape), all F32 — or, for parameters
// (`any_float`), F32/BF16/F16: a mixed-precision run writes its bf16/f16 parameters and loading
// converts (Note [Mixed precision] in parallel/engine.h).
void check_tensors(const SafetensorsReader& reader,
                   const std::vector<std::pair<std::string, tensor::Shape>>& expected,
                   std::string_view what, bool any_float = false) {
  std::map<std::string, const SafetensorsEntry*> present;
  for (const SafetensorsEntry& e : reader.entries()) present.emplace(e.name, &e);
  for (const auto& [name, shape] : expected) {
    auto it = present.find(name);
    if (it == present.end())
      user_error("{}: no {} '{}'; the checkpoint was written for a different model or optimizer",
                 reader.path(), what, name);
    const SafetensorsEntry& e = *it->second;
    const bool dtype_ok =
        e.dtype == DType::F32 || (any_float && (e.dtype == DType::BF16 || e.dtype == DType::F16));
    if (!dtype_ok || !(e.shape == shape))
      user_error(
          "{}: {} '{}' is {}{} but this run expects f32{}; the checkpoint was written for a "
          "different model size (check the model config against the checkpoint's config.yaml)",
          reader.path(), what, name, dtype_name(e.dtype), e.shape.str(), shape.str());
    present.erase(it);
  }
  if (!present.empty())
    user_error(
        "{}: unexpected {} '{}' ({} extra); the checkpoint was written for a different model or "
        "optimizer",
        reader.path(), what, present.begin()->first, present.size());
}

}  // namespace checkpoint_files

using namespace checkpoint_files;

std::string save_checkpoint(const std::string& run_dir, const models::CausalLM& model,
                            const optim::Optimizer* optimizer, const TrainerState& state,
                            const std::string& config_yaml, int64_t keep) {
  STRATA_USER_CHECK(keep >= 0, "checkpoint keep count must be >= 0 (0 keeps all), got {}", keep);
  STRATA_USER_CHECK(state.step >= 0, "checkpoint step must be >= 0, got {}", state.step);
  const std::string root = join(run_dir, "checkpoints");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec || !fs::is_directory(root))
    user_error("{}: cannot create the checkpoint directory ({})", root,
               ec ? ec.message() : "exists and is not a directory");

  const std::string name = step_dir_name(state.step);
  const std::string final_dir = join(root, name);
  const std::string tmp = fmt::format("{}.tmp.{}", final_dir, ::getpid());
  fs::remove_all(tmp);
  try {
    fs::create_directory(tmp);
    write_step_directory(tmp, model, optimizer, state, config_yaml);
    publish_directory(tmp, final_dir);
    fsync_path(root, true);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    user_error("{}: cannot write checkpoint ({})", final_dir, e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  write_text_atomic(join(root, kLatest), name + "\n");
  fsync_path(root, true);
  prune(root, keep, name);
  return final_dir;
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  const std::string root = join(run_dir, "checkpoints");
  const std::string latest = join(root, kLatest);
  if (!fs::exists(latest)) {
    // Step directories without the pointer (deleted by hand, or a crash between a run's first
    // checkpoint and its pointer): starting afresh would replace and prune them, so nothing is
    // chosen here; the user says which one to resume from.
    std::vector<std::pair<int64_t, std::string>> steps;
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (auto step = parse_step_dir(name); step && it->is_directory())
        steps.emplace_back(*step, name);
    }
    if (steps.empty()) return std::nullopt;
    const std::string newest = std::max_element(steps.begin(), steps.end())->second;
    user_error(
        "{}: missing, but {} holds {} checkpoint director{} (the newest {}); a new run here "
        "would replace them. To resume, write the name of one into it (e.g. `echo {} > {}`) or "
        "set training.resume to its path; to start afresh, pick another run.dir. Nothing was "
        "changed",
        latest, root, steps.size(), steps.size() == 1 ? "y" : "ies", newest, newest, latest);
  }
  std::string text = read_whole_file(latest);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (!parse_step_dir(text))
    user_error(
        "{}: expected one line naming a step_<N> directory, found '{}'; delete it to start "
        "afresh or write the name of the checkpoint to resume from",
        latest, data::unicode::printable(text.substr(0, 80)));
  const std::string dir = join(root, text);
  if (!fs::is_directory(dir))
    user_error(
        "{}: names '{}', which does not exist; delete {} or point it at an existing step_* "
        "directory",
        latest, text, latest);
  return dir;
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::is_regular_file(join(path, kStateFile))) return path;
  if (!fs::is_directory(path)) user_error("{}: no such checkpoint or run directory", path);
  if (auto latest = find_latest_checkpoint(path)) return *latest;
  user_error(
      "{}: neither a checkpoint directory (no {}) nor a run directory with checkpoints/latest",
      path, kStateFile);
}

TrainerState load_checkpoint(const std::string& dir, models::CausalLM& model,
                             optim::Optimizer* optimizer, std::string_view expected_model_name) {
  if (!fs::is_directory(dir)) user_error("{}: checkpoint directory does not exist", dir);
  const std::string state_path = require_file(dir, kStateFile);
  if (optimizer == nullptr && !fs::exists(join(dir, kModelFile))) {
    // ZeRO-3 checkpoints hold the parameters in per-rank shards (Note [Distributed checkpoints]).
    OpenedCheckpoint opened = open_checkpoint(dir, model, expected_model_name);
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.starts_with("model.rank") && f.ends_with(".safetensors"))
        SafetensorsReader(e.path().string()).verify();  // before the model is touched
    }
    for (const models::FlatUnit& u : model.flat_units())
      opened.index->fill(u.name, "param", 0, u.params);
    return opened.state;
  }
  const std::string model_path = require_file(dir, kModelFile);
  const std::string opt_path = optimizer ? require_file(dir, kOptimizerFile) : std::string();

  // ---- validate everything (Note [Atomic checkpoints]) ----
  TrainerState state = read_trainer_state(state_path);
  if (!expected_model_name.empty() && state.model_name != expected_model_name)
    user_error("{}: checkpoint is of model '{}', this run is configured for '{}'", state_path,
               state.model_name, expected_model_name);

  SafetensorsReader model_reader(model_path);
  require_digests(model_reader, state, dir);
  auto family = model_reader.metadata().find("family");
  if (family != model_reader.metadata().end() && family->second != model.family())
    user_error("{}: checkpoint is of a '{}'-family model, this model is '{}'", model_path,
               family->second, model.family());
  std::vector<std::pair<std::string, tensor::Shape>> expected;
  for (const models::FlatUnit& u : model.flat_units())
    for (size_t k = 0; k < u.names.size(); ++k) expected.emplace_back(u.names[k], u.shapes[k]);
  check_tensors(model_reader, expected, "parameter", /*any_float=*/true);

  std::optional<SafetensorsReader> opt_reader;
  int64_t opt_step = 0;
  if (optimizer != nullptr) {
    opt_reader.emplace(opt_path);
    require_digests(*opt_reader, state, dir);
    const auto& meta = opt_reader->metadata();
    auto name = meta.find("optimizer");
    if (name == meta.end() || name->second != optimizer->name())
      user_error("{}: holds the state of optimizer '{}', this run uses '{}'", opt_path,
                 name == meta.end() ? "?" : name->second, optimizer->name());
    auto step = meta.find("step");
    const char* end = step == meta.end() ? nullptr : step->second.data() + step->second.size();
    if (step == meta.end() || std::from_chars(step->second.data(), end, opt_step).ptr != end ||
        opt_step < 0)
      user_error("{}: metadata 'step' is missing or not a non-negative integer", opt_path);
    std::vector<std::pair<std::string, tensor::Shape>> opt_expected;
    for (const optim::NamedTensor& t : optimizer->state_dict().tensors)
      opt_expected.emplace_back(t.name, t.tensor.shape());
    check_tensors(*opt_reader, opt_expected, "optimizer state");
  }

  // Every tensor through its digest (Note [Checkpoint digests]) before the model is touched.
  model_reader.verify();
  if (opt_reader) opt_reader->verify();

  // ---- load: same dtype and shape, so each copy is the exact bytes ----
  for (const models::FlatUnit& u : model.flat_units())
    for (size_t k = 0; k < u.names.size(); ++k) {
      Tensor dst = u.variables[k].data();  // a view into the flat buffer: copy in place
      dst.copy_(model_reader.read(u.names[k]));
    }
  if (optimizer != nullptr) {
    optim::OptimizerState s;
    s.step = opt_step;
    for (const SafetensorsEntry& e : opt_reader->entries())
      s.tensors.push_back({e.name, opt_reader->read(e.name)});
    optimizer->load_state_dict(s);
  }
  return state;
}

CheckpointCheck verify_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) user_error("{}: checkpoint directory does not exist", dir);
  const TrainerState state = read_trainer_state(require_file(dir, kStateFile));
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors")
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty())
    user_error("{}: no .safetensors files; the checkpoint is incomplete or not a checkpoint", dir);
  CheckpointCheck out;
  out.digests = state.digests;
  for (const std::string& f : files) {
    SafetensorsReader r(f);
    require_digests(r, state, dir);
    r.verify();
    ++out.files;
    for (const auto& e : r.entries()) {
      ++out.tensors;
      out.bytes += e.end - e.begin;
    }
  }
  return out;
}

std::string checkpoint_config_path(const std::string& checkpoint_dir) {
  return require_file(checkpoint_dir, kConfigFile);
}

}  // namespace strata::runtime
