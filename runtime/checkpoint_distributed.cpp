// The distributed checkpoints of Note [Distributed checkpoints] (runtime/checkpoint.h): every
// rank writes its shards, rank 0 the whole files, and a checkpoint is published only when every
// rank succeeded; loading checks the same on every rank.
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_files.h"
#include "tensor/safetensors.h"

namespace strata::runtime {

namespace fs = std::filesystem;
using namespace checkpoint_files;
using tensor::SafetensorsReader;
using tensor::Tensor;

namespace {

// One integer agreed over `comm`: the maximum of every rank's `value`. The tensor travels on
// `device`, the run's (an nccl communicator moves GPU memory only).
int64_t allreduce_max(comm::Communicator& comm, Device device, int64_t value) {
  Tensor t = Tensor::empty({1}, DType::I64);
  t.data<int64_t>()[0] = value;
  if (!device.is_cpu()) t = t.to(device);
  comm.allreduce(t, comm::ReduceOp::Max)->wait();
  return t.item<int64_t>();
}

int64_t broadcast_from_0(comm::Communicator& comm, Device device, int64_t value) {
  Tensor t = Tensor::empty({1}, DType::I64);
  t.data<int64_t>()[0] = value;
  if (!device.is_cpu()) t = t.to(device);
  comm.broadcast(t, 0)->wait();
  return t.item<int64_t>();
}

// Runs `fn` on every rank; if it failed on any rank, every rank raises an error (the failing
// ranks their own message). `cleanup` runs first on failure.
template <typename Fn, typename Cleanup>
void all_or_nothing(comm::Communicator& comm, Device device, const std::string& what, Fn&& fn,
                    Cleanup&& cleanup) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int64_t failed = allreduce_max(comm, device, error.empty() ? 0 : comm.rank() + 1);
  if (failed == 0) return;
  cleanup();
  if (!error.empty()) user_error("{}", error);
  user_error("{}: rank {} failed (see its error); nothing was published", what, failed - 1);
}

std::string rank_file(std::string_view stem, int rank, int size) {
  return fmt::format("{}.rank{:05d}-of-{:05d}.safetensors", stem, rank, size);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const CheckpointParts& parts,
                            const TrainerState& state, const std::string& config_yaml, int64_t keep,
                            comm::Communicator& comm, Device device) {
  STRATA_USER_CHECK(keep >= 0, "checkpoint keep count must be >= 0 (0 keeps all), got {}", keep);
  STRATA_USER_CHECK(state.step >= 0, "checkpoint step must be >= 0, got {}", state.step);
  const int rank = comm.rank(), size = comm.size();
  const std::string root = join(run_dir, "checkpoints");
  const std::string name = step_dir_name(state.step);
  const std::string final_dir = join(root, name);
  std::string tmp;
  auto remove_tmp = [&] {
    std::error_code ec;
    if (rank == 0 && !tmp.empty()) fs::remove_all(tmp, ec);
  };
  // 1. Rank 0 makes the temporary directory; everyone learns its name.
  int64_t pid = 0;
  all_or_nothing(
      comm, device, final_dir,
      [&] {
        if (rank != 0) return;
        std::error_code ec;
        fs::create_directories(root, ec);
        if (ec || !fs::is_directory(root))
          user_error("{}: cannot create the checkpoint directory ({})", root,
                     ec ? ec.message() : "exists and is not a directory");
        pid = ::getpid();
        tmp = fmt::format("{}.tmp.{}", final_dir, pid);
        fs::remove_all(tmp);
        if (!fs::create_directory(tmp, ec) || ec)
          user_error("{}: cannot create ({})", tmp, ec ? ec.message() : "exists");
      },
      remove_tmp);
  pid = broadcast_from_0(comm, device, pid);
  tmp = fmt::format("{}.tmp.{}", final_dir, pid);
  // 2. Every rank writes its files.
  all_or_nothing(
      comm, device, final_dir,
      [&] {
        if (!fs::is_directory(tmp))
          user_error(
              "{}: rank {} does not see the checkpoint directory rank 0 made; run.dir must "
              "be on a file system shared by every rank",
              tmp, rank);
        std::map<std::string, std::string> meta = {
            {"family", parts.model ? parts.model->family() : ""},
            {"model_name", state.model_name},
            {"rank", std::to_string(rank)},
            {"world", std::to_string(size)}};
        STRATA_CHECK(parts.model != nullptr, "CheckpointParts without a model");
        if (rank == 0 && parts.write_model && parts.model_stream)
          write_model_file(tmp, *parts.model, state, parts.model_stream);
        const std::string model_file = join(tmp, rank_file("model", rank, size));
        if (!parts.param_shards.empty())
          save_flat_shards(model_file, *parts.model, parts.param_shards, meta);
        else if (!parts.param_stream.empty())
          save_flat_shards(model_file, *parts.model, parts.param_stream, meta);
        if (!parts.optimizer_shards.empty() || !parts.optimizer_stream.empty()) {
          meta["optimizer"] = parts.optimizer_name;
          meta["step"] = std::to_string(parts.optimizer_step);
          const std::string file = join(
              tmp, size == 1 ? std::string(kOptimizerFile) : rank_file("optimizer", rank, size));
          if (!parts.optimizer_shards.empty())
            save_flat_shards(file, *parts.model, parts.optimizer_shards, meta);
          else
            save_flat_shards(file, *parts.model, parts.optimizer_stream, meta);
        }
        if (rank == 0) {
          if (parts.write_model && !parts.model_stream) {
            write_step_directory(tmp, *parts.model, nullptr, state, config_yaml);
          } else {
            write_trainer_files(tmp, state, config_yaml);
          }
        }
      },
      remove_tmp);
  // 3. Rank 0 publishes; the others wait for the outcome.
  all_or_nothing(
      comm, device, final_dir,
      [&] {
        if (rank != 0) return;
        try {
          fsync_path(tmp, true);
          publish_directory(tmp, final_dir);
          fsync_path(root, true);
        } catch (const fs::filesystem_error& e) {
          user_error("{}: cannot write checkpoint ({})", final_dir, e.what());
        }
        tmp.clear();
        write_text_atomic(join(root, kLatest), name + "\n");
        fsync_path(root, true);
        prune(root, keep, name);
      },
      remove_tmp);
  return final_dir;
}

OpenedCheckpoint open_checkpoint(const std::string& dir, const models::CausalLM& model,
                                 std::string_view expected_model_name) {
  if (!fs::is_directory(dir)) user_error("{}: checkpoint directory does not exist", dir);
  OpenedCheckpoint out;
  out.dir = dir;
  out.state = read_trainer_state(require_file(dir, kStateFile));
  if (!expected_model_name.empty() && out.state.model_name != expected_model_name)
    user_error("{}: checkpoint is of model '{}', this run is configured for '{}'",
               join(dir, kStateFile), out.state.model_name, expected_model_name);
  std::vector<std::string> whole, shards, model_shards, optimizer_files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f == kModelFile)
      whole.push_back(e.path().string());
    else if (f.starts_with("model.rank") && f.ends_with(".safetensors"))
      model_shards.push_back(e.path().string());
    else if (f == kOptimizerFile ||
             (f.starts_with("optimizer.rank") && f.ends_with(".safetensors")))
      optimizer_files.push_back(e.path().string());
  }
  std::sort(model_shards.begin(), model_shards.end());
  std::sort(optimizer_files.begin(), optimizer_files.end());
  if (whole.empty() && model_shards.empty())
    user_error(
        "{}: no model.safetensors and no model.rank*.safetensors; the checkpoint is "
        "incomplete or not a checkpoint",
        dir);
  for (const std::string& f : model_shards) require_digests(SafetensorsReader(f), out.state, dir);
  for (const std::string& f : whole) {
    SafetensorsReader r(f);
    require_digests(r, out.state, dir);
    auto family = r.metadata().find("family");
    if (family != r.metadata().end() && family->second != model.family())
      user_error("{}: checkpoint is of a '{}'-family model, this model is '{}'", f, family->second,
                 model.family());
  }
  for (const std::string& f : optimizer_files) {
    SafetensorsReader r(f);
    require_digests(r, out.state, dir);
    const auto& meta = r.metadata();
    auto name = meta.find("optimizer");
    auto step = meta.find("step");
    int64_t st = -1;
    if (step != meta.end()) {
      const char* end = step->second.data() + step->second.size();
      if (std::from_chars(step->second.data(), end, st).ptr != end) st = -1;
    }
    if (name == meta.end() || st < 0)
      user_error("{}: metadata 'optimizer' or 'step' is missing or malformed", f);
    if (out.optimizer_name.empty()) {
      out.optimizer_name = name->second;
      out.optimizer_step = st;
    } else if (name->second != out.optimizer_name || st != out.optimizer_step) {
      user_error(
          "{}: holds {} state at step {}, but {} holds {} at step {}; the checkpoint mixes "
          "files of different runs",
          f, name->second, st, optimizer_files.front(), out.optimizer_name, out.optimizer_step);
    }
  }
  shards = model_shards;
  shards.insert(shards.end(), optimizer_files.begin(), optimizer_files.end());
  out.index = std::make_unique<FlatShardIndex>(model, whole, shards);
  return out;
}

}  // namespace strata::runtime
