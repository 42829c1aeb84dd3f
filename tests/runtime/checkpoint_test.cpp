// Checkpoints (runtime/checkpoint.h): bitwise save/load of weights and AdamW state after
// real steps, resume equivalence, keep-N pruning, the latest pointer, and errors that leave no
// temporary files, the model untouched and the previous checkpoint loadable.
#include "runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "models/registry.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/safetensors.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using models::CausalLM;
using models::FlatUnit;

std::unique_ptr<CausalLM> make_model(uint64_t seed, const std::string& n_embd = "32",
                                     const std::string& name = "gpt2-tiny") {
  models::ModelOptions o;
  o.seed = seed;
  if (name == "gpt2-tiny")
    o.overrides = {{"vocab_size", "61"},
                   {"n_positions", "16"},
                   {"n_embd", n_embd},
                   {"n_layer", "2"},
                   {"n_head", "4"}};
  return models::ModelRegistry::global().create(name, o);
}

// One group per unit; matrices decay.
std::vector<optim::ParamGroup> param_groups(CausalLM& model) {
  std::vector<optim::ParamGroup> groups;
  for (FlatUnit& u : model.flat_units()) {
    optim::ParamGroup g;
    g.param = u.params;
    g.grad = u.grads;
    for (size_t k = 0; k < u.names.size(); ++k)
      g.segments.push_back({u.names[k], u.offsets[k], u.numels[k], u.shapes[k].ndim() >= 2});
    groups.push_back(std::move(g));
  }
  return groups;
}

std::unique_ptr<optim::AdamW> make_adamw(CausalLM& model) {
  optim::AdamWConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  return std::make_unique<optim::AdamW>(param_groups(model), c);
}

// One real training step on a fixed batch depending on `step`.
void train_step(CausalLM& model, optim::Optimizer& opt, int step) {
  std::vector<int64_t> ids(2 * 9);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + step * 13) % 61);
  std::vector<int64_t> x, y;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 8; ++t) {
      x.push_back(ids[b * 9 + t]);
      y.push_back(ids[b * 9 + t + 1]);
    }
  model.zero_grad();
  model.loss(tensor::from_ints(x, {2, 8}), tensor::from_ints(y, {2, 8})).backward();
  opt.step(1e-2);
}

std::vector<char> bytes(const tensor::Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  return {p, p + t.nbytes()};
}

std::vector<std::vector<char>> weights(const CausalLM& m) {
  std::vector<std::vector<char>> out;
  for (const FlatUnit& u : m.flat_units()) out.push_back(bytes(u.params));
  return out;
}

std::vector<std::vector<char>> opt_state(const optim::Optimizer& o) {
  std::vector<std::vector<char>> out;
  for (const optim::NamedTensor& t : o.state_dict().tensors) out.push_back(bytes(t.tensor));
  return out;
}

std::string read_file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file_bytes(const fs::path& p, const std::string& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), b.size());
}

// A safetensors file's bytes with its digests taken out (Note [Safetensors digests]), as a writer
// without them would have written it.
std::string without_digests(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  auto header = nlohmann::json::parse(file.substr(8, n));
  auto& meta = header["__metadata__"];
  for (auto it = meta.begin(); it != meta.end();)
    it = it.key().starts_with("strata.") ? meta.erase(it) : std::next(it);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  return std::string(reinterpret_cast<const char*>(&len), 8) + text + file.substr(8 + n);
}

TrainerState make_state(int64_t step) {
  TrainerState s;
  s.step = step;
  s.samples_consumed = 16 * step + 3;
  s.rng_seed = 0xfedcba9876543210ull;  // above INT64_MAX: must survive JSON
  s.rng_offset = 17 + static_cast<uint64_t>(step);
  s.loss_scale = 32768.0;
  s.model_name = "gpt2-tiny";
  return s;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = fs::temp_directory_path() /
           fmt::format("strata_ckpt_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(run_);
    fs::create_directories(run_);
  }
  void TearDown() override { fs::remove_all(run_); }

  std::string ckpt_root() const { return (run_ / "checkpoints").string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ckpt_root()))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  void expect_no_tmp() const {
    for (const auto& e : fs::recursive_directory_iterator(run_))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }

  // Expects a UserError containing every needle, then checks that the model and optimizer are
  // untouched.
  void expect_load_error(const std::string& dir, CausalLM& m, optim::Optimizer* o,
                         const std::vector<std::string>& needles,
                         std::string_view expected_name = {}) {
    auto w = weights(m);
    auto s = o ? opt_state(*o) : std::vector<std::vector<char>>{};
    try {
      load_checkpoint(dir, m, o, expected_name);
      ADD_FAILURE() << "expected a UserError";
    } catch (const UserError& e) {
      std::string msg = e.what();
      for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
    }
    EXPECT_TRUE(weights(m) == w) << "a failed load must not touch the model";
    if (o) {
      EXPECT_TRUE(opt_state(*o) == s) << "a failed load must not touch the optimizer";
    }
    expect_no_tmp();
  }

  // verify_checkpoint (convert --verify) must refuse `dir` with every needle in its message.
  static void expect_verify_error(const fs::path& dir, const std::vector<std::string>& needles) {
    try {
      verify_checkpoint(dir.string());
      ADD_FAILURE() << "verify_checkpoint accepted a damaged checkpoint";
    } catch (const UserError& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }

  fs::path run_;
};

TEST_F(Checkpoint, SaveLoadIsBitwiseAndResumeContinuesIdentically) {
  auto a = make_model(1);
  auto opt_a = make_adamw(*a);
  for (int s = 0; s < 3; ++s) train_step(*a, *opt_a, s);
  const std::string dir = save_checkpoint(run_.string(), *a, opt_a.get(), make_state(3),
                                          "model:\n  name: gpt2-tiny\n", 0);
  EXPECT_EQ(dir, (run_ / "checkpoints" / "step_00000003").string());
  expect_no_tmp();

  auto b = make_model(2);
  auto opt_b = make_adamw(*b);
  ASSERT_FALSE(weights(*a) == weights(*b));
  TrainerState st = load_checkpoint(dir, *b, opt_b.get(), "gpt2-tiny");
  EXPECT_TRUE(weights(*a) == weights(*b));
  EXPECT_TRUE(opt_state(*opt_a) == opt_state(*opt_b));
  EXPECT_EQ(opt_b->step_count(), 3);
  const TrainerState want = make_state(3);
  EXPECT_EQ(st.step, want.step);
  EXPECT_EQ(st.samples_consumed, want.samples_consumed);
  EXPECT_EQ(st.rng_seed, want.rng_seed);
  EXPECT_EQ(st.rng_offset, want.rng_offset);
  EXPECT_EQ(st.loss_scale, want.loss_scale);
  EXPECT_EQ(st.model_name, want.model_name);
  // Parameter views still alias the flat buffers (copied in place, never rebound).
  for (const FlatUnit& u : b->flat_units())
    for (size_t k = 0; k < u.names.size(); ++k)
      EXPECT_EQ(u.variables[k].data().data_ptr(), u.params.data<float>() + u.offsets[k]);

  // Resume: two more steps on both give bitwise the same weights and state.
  for (int s = 3; s < 5; ++s) {
    train_step(*a, *opt_a, s);
    train_step(*b, *opt_b, s);
  }
  EXPECT_TRUE(weights(*a) == weights(*b));
  EXPECT_TRUE(opt_state(*opt_a) == opt_state(*opt_b));

  std::ifstream cfg(checkpoint_config_path(dir));
  std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "model:\n  name: gpt2-tiny\n");
}

TEST_F(Checkpoint, WeightsOnlyLoadAndSaveWithoutOptimizer) {
  auto a = make_model(1);
  const std::string dir = save_checkpoint(run_.string(), *a, nullptr, make_state(0), "", 0);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "optimizer.safetensors"));
  auto b = make_model(2);
  load_checkpoint(dir, *b, nullptr);
  EXPECT_TRUE(weights(*a) == weights(*b));
  auto opt_b = make_adamw(*b);
  expect_load_error(dir, *b, opt_b.get(), {"optimizer.safetensors", "missing"});
}

TEST_F(Checkpoint, KeepsTheNewestNAndLatestPointsAtTheLastSave) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  EXPECT_FALSE(find_latest_checkpoint(run_.string()).has_value());
  for (int64_t step : {10, 20, 30, 40, 50}) {
    std::string dir = save_checkpoint(run_.string(), *m, opt.get(), make_state(step), "", 2);
    EXPECT_EQ(find_latest_checkpoint(run_.string()), dir);
    EXPECT_EQ(resolve_checkpoint(run_.string()), dir);
    EXPECT_EQ(resolve_checkpoint(dir), dir);
  }
  EXPECT_EQ(listing(), (std::vector<std::string>{"latest", "step_00000040", "step_00000050"}));
  std::ifstream latest(run_ / "checkpoints" / "latest");
  std::string line;
  std::getline(latest, line);
  EXPECT_EQ(line, "step_00000050");

  // keep = 0 keeps everything; saving an older step keeps it and points latest at it.
  save_checkpoint(run_.string(), *m, opt.get(), make_state(5), "", 0);
  EXPECT_EQ(find_latest_checkpoint(run_.string()),
            (run_ / "checkpoints" / "step_00000005").string());
  EXPECT_EQ(listing().size(), 4u);
  // keep = 1 keeps the one just written even when it is not the highest step.
  save_checkpoint(run_.string(), *m, opt.get(), make_state(7), "", 1);
  EXPECT_EQ(listing(), (std::vector<std::string>{"latest", "step_00000007"}));
  expect_no_tmp();
  EXPECT_THROW(save_checkpoint(run_.string(), *m, opt.get(), make_state(8), "", -1), UserError);
}

TEST_F(Checkpoint, ResavingAStepReplacesIt) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  const std::string dir = save_checkpoint(run_.string(), *m, opt.get(), make_state(4), "a", 0);
  train_step(*m, *opt, 0);
  TrainerState s = make_state(4);
  s.samples_consumed = 999;
  EXPECT_EQ(save_checkpoint(run_.string(), *m, opt.get(), s, "b", 0), dir);
  expect_no_tmp();
  auto b = make_model(2);
  auto opt_b = make_adamw(*b);
  EXPECT_EQ(load_checkpoint(dir, *b, opt_b.get()).samples_consumed, 999);
  EXPECT_TRUE(weights(*m) == weights(*b));
  EXPECT_TRUE(opt_state(*opt) == opt_state(*opt_b));
}

TEST_F(Checkpoint, BrokenCheckpointsAreUserErrorsThatTouchNothing) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  train_step(*m, *opt, 0);
  const std::string good = save_checkpoint(run_.string(), *m, opt.get(), make_state(1), "", 0);
  // A second checkpoint to break in various ways.
  const std::string bad = save_checkpoint(run_.string(), *m, opt.get(), make_state(2), "", 0);
  const fs::path bad_path(bad);

  auto target = make_model(5);
  auto target_opt = make_adamw(*target);
  auto expect_good_still_loads = [&] {
    auto fresh = make_model(6);
    auto fresh_opt = make_adamw(*fresh);
    load_checkpoint(good, *fresh, fresh_opt.get());
    EXPECT_TRUE(weights(*fresh) == weights(*m));
  };

  // Missing file.
  fs::rename(bad_path / "trainer_state.json", run_ / "saved_state.json");
  expect_load_error(bad, *target, target_opt.get(), {"trainer_state.json", "missing"});
  fs::rename(run_ / "saved_state.json", bad_path / "trainer_state.json");

  // Truncated model.safetensors.
  const fs::path model_file = bad_path / "model.safetensors";
  fs::copy_file(model_file, run_ / "model.bak");
  fs::resize_file(model_file, fs::file_size(model_file) - 4);
  expect_load_error(bad, *target, target_opt.get(),
                    {model_file.string(), "not a valid safetensors file"});
  fs::remove(model_file);
  fs::rename(run_ / "model.bak", model_file);

  // A checkpoint of a different model size.
  auto wide = make_model(3, "48");
  auto wide_opt = make_adamw(*wide);
  expect_load_error(
      bad, *wide, wide_opt.get(),
      {model_file.string(), "wpe.weight", "[16, 32]", "[16, 48]", "different model size"});
  // A different family.
  auto llama = make_model(3, "", "llama-tiny");
  expect_load_error(bad, *llama, nullptr, {"gpt2", "llama"});
  // A different model name.
  expect_load_error(bad, *target, target_opt.get(), {"gpt2-tiny", "gpt2-small"}, "gpt2-small");

  // Optimizer state mismatch: another optimizer, and AdamW over different groups.
  optim::SgdConfig sc;
  sc.momentum = 0.9;
  optim::Sgd sgd(param_groups(*target), sc);
  expect_load_error(bad, *target, &sgd, {"optimizer.safetensors", "AdamW", "SGD"});
  auto groups = param_groups(*target);
  groups.pop_back();
  optim::AdamW fewer(std::move(groups));
  expect_load_error(bad, *target, &fewer, {"optimizer.safetensors", "unexpected optimizer state"});

  // Corrupt trainer state.
  std::ofstream(bad_path / "trainer_state.json") << "{\"step\": \"two\"}";
  expect_load_error(bad, *target, target_opt.get(), {"trainer_state.json", "'step'"});

  expect_good_still_loads();
  // The bad checkpoint was never partially applied: the target still has its own init.
  EXPECT_TRUE(weights(*target) == weights(*make_model(5)));
}

// Note [Checkpoint digests]: a byte changed in any file after the save is refused, naming the
// file, before the model or the optimizer is touched; so is a safetensors file without digests
// put in a checkpoint written with them.
TEST_F(Checkpoint, DamagedFilesAreRefusedBeforeAnythingIsTouched) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  train_step(*m, *opt, 0);
  const fs::path dir = save_checkpoint(run_.string(), *m, opt.get(), make_state(1), "", 0);
  auto target = make_model(5);
  auto target_opt = make_adamw(*target);
  auto flip = [](const fs::path& f, int64_t from_end) {
    std::string b = read_file_bytes(f);
    b[b.size() - static_cast<size_t>(from_end)] ^= 0x01;
    write_file_bytes(f, b);
  };
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path f = dir / name;
    const std::string good = read_file_bytes(f);
    flip(f, 3);  // the last tensor's data: the header still opens
    expect_load_error(dir.string(), *target, target_opt.get(), {f.string(), "damaged or changed"});
    expect_verify_error(dir, {f.string(), "damaged or changed"});
    write_file_bytes(f, good);
  }
  const fs::path state = dir / "trainer_state.json";
  const std::string good_state = read_file_bytes(state);
  std::string bad_state = good_state;
  const std::string step_one = "\"step\": 1,";
  ASSERT_NE(bad_state.find(step_one), std::string::npos) << bad_state;
  bad_state.replace(bad_state.find(step_one), step_one.size(), "\"step\": 7,");
  write_file_bytes(state, bad_state);
  expect_load_error(dir.string(), *target, target_opt.get(),
                    {state.string(), "damaged or changed"});
  expect_verify_error(dir, {state.string(), "damaged or changed"});
  write_file_bytes(state, good_state);
  // optimizer.safetensors replaced by a file without digests.
  const fs::path of = dir / "optimizer.safetensors";
  const std::string good_opt = read_file_bytes(of);
  write_file_bytes(of, without_digests(good_opt));
  expect_load_error(dir.string(), *target, target_opt.get(),
                    {of.string(), "has no digests", "trainer_state.json"});
  expect_verify_error(dir, {of.string(), "has no digests"});
  write_file_bytes(of, good_opt);
  const CheckpointCheck check = verify_checkpoint(dir.string());
  EXPECT_TRUE(check.digests);
  EXPECT_EQ(check.files, 2);
  const size_t tensors =
      tensor::SafetensorsReader((dir / "model.safetensors").string()).entries().size() +
      tensor::SafetensorsReader(of.string()).entries().size();
  EXPECT_EQ(check.tensors, static_cast<int64_t>(tensors));
  load_checkpoint(dir.string(), *target, target_opt.get());
  EXPECT_TRUE(weights(*target) == weights(*m));
}

// Checkpoints written before digests (no "digest" in trainer_state.json, none in the
// safetensors files) still load, bitwise.
TEST_F(Checkpoint, CheckpointsWithoutDigestsStillLoad) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  train_step(*m, *opt, 0);
  const fs::path dir = save_checkpoint(run_.string(), *m, opt.get(), make_state(1), "", 0);
  for (const char* name : {"model.safetensors", "optimizer.safetensors"})
    write_file_bytes(dir / name, without_digests(read_file_bytes(dir / name)));
  auto state = nlohmann::ordered_json::parse(read_file_bytes(dir / "trainer_state.json"));
  ASSERT_TRUE(state.contains("digest"));
  state.erase("digest");
  write_file_bytes(dir / "trainer_state.json", state.dump(2) + "\n");
  auto target = make_model(5);
  auto target_opt = make_adamw(*target);
  const TrainerState s = load_checkpoint(dir.string(), *target, target_opt.get());
  EXPECT_FALSE(s.digests);
  EXPECT_FALSE(verify_checkpoint(dir.string()).digests);
  EXPECT_EQ(s.step, 1);
  EXPECT_TRUE(weights(*target) == weights(*m));
  EXPECT_TRUE(opt_state(*target_opt) == opt_state(*opt));
}

TEST_F(Checkpoint, MissingDanglingAndMalformedLatest) {
  EXPECT_FALSE(find_latest_checkpoint(run_.string()).has_value());
  EXPECT_THROW(resolve_checkpoint(run_.string()), UserError);
  auto m = make_model(1);
  const std::string good = save_checkpoint(run_.string(), *m, nullptr, make_state(1), "", 0);
  const fs::path latest = run_ / "checkpoints" / "latest";
  for (const char* text : {"step_00000099\n", "../../etc\n", "\n", "step_1 step_2"}) {
    SCOPED_TRACE(text);
    std::ofstream(latest) << text;
    try {
      find_latest_checkpoint(run_.string());
      ADD_FAILURE() << "expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(latest.string()), std::string::npos) << e.what();
    }
  }
  // A malformed pointer is quoted printable (unicode::printable), whatever bytes it holds.
  std::ofstream(latest) << std::string("step_\0\x1b[2J", 10);
  try {
    find_latest_checkpoint(run_.string());
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("found 'step_\xEF\xBF\xBD\xEF\xBF\xBD[2J'"),
              std::string::npos)
        << e.what();
  }
  // No pointer beside step directories: neither "no checkpoint" (a fresh run would replace
  // them) nor a guess; the error names the newest, and the files stay as they were.
  save_checkpoint(run_.string(), *m, nullptr, make_state(7), "", 0);
  fs::remove(latest);
  for (auto find : {std::function<void()>([&] { find_latest_checkpoint(run_.string()); }),
                    std::function<void()>([&] { resolve_checkpoint(run_.string()); })}) {
    try {
      find();
      ADD_FAILURE() << "expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(latest.string() + ": missing"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("2 checkpoint directories (the newest step_00000007)"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(latest));
  EXPECT_TRUE(fs::is_directory(run_ / "checkpoints" / "step_00000001"));
  fs::remove_all(run_ / "checkpoints" / "step_00000007");
  std::ofstream(latest) << "step_00000001\n";
  // Saving again repairs the pointer; the earlier checkpoint stayed loadable throughout.
  auto fresh = make_model(2);
  load_checkpoint(good, *fresh, nullptr);
  EXPECT_TRUE(weights(*fresh) == weights(*m));
  save_checkpoint(run_.string(), *m, nullptr, make_state(2), "", 0);
  EXPECT_EQ(find_latest_checkpoint(run_.string()),
            (run_ / "checkpoints" / "step_00000002").string());
  expect_no_tmp();
}

TEST_F(Checkpoint, AFailedSaveLeavesNoTemporaryFilesAndKeepsThePrevious) {
  auto m = make_model(1);
  auto opt = make_adamw(*m);
  const std::string good = save_checkpoint(run_.string(), *m, opt.get(), make_state(1), "", 0);
  // `latest` replaced by a directory: its rename must fail after the step directory is written.
  fs::remove(run_ / "checkpoints" / "latest");
  fs::create_directory(run_ / "checkpoints" / "latest");
  EXPECT_THROW(save_checkpoint(run_.string(), *m, opt.get(), make_state(2), "", 0), UserError);
  expect_no_tmp();
  fs::remove(run_ / "checkpoints" / "latest");
  // A run directory that is a file cannot hold checkpoints.
  std::ofstream(run_ / "file") << "x";
  EXPECT_THROW(save_checkpoint((run_ / "file").string(), *m, opt.get(), make_state(3), "", 0),
               UserError);
  expect_no_tmp();
  auto fresh = make_model(2);
  auto fresh_opt = make_adamw(*fresh);
  load_checkpoint(good, *fresh, fresh_opt.get());
  EXPECT_TRUE(weights(*fresh) == weights(*m));
}

}  // namespace
}  // namespace strata::runtime
