// Memory-centric tiling through `train` (model.config.tiling, Note [Tiled linear] in
// autograd/functions.h): GPT-2 trained with every block linear in tiles keeps the untiled run's
// losses and weights bitwise (f32 on the CPU, dropout on, uneven tiles).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/train_config.h"
#include "runtime/trainer.h"
#include "tests/support/tool_test_util.h"

namespace strata::runtime {
namespace {

using testing::ScratchDir;

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // every flat unit's parameters after training
};

Trained train(const ScratchDir& tmp, const std::string& name, int tiling) {
  const std::string text = fmt::format(R"(run: {{dir: {run}, seed: 7, threads: 1}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 48, n_head: 2, n_positions: 32, dropout: 0.1, tiling: {tiling}}}
data: {{train: "{data}/train_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: 2, grad_accum_steps: 2, seq_len: 16}}
optimizer: {{name: adamw, lr: 1.0e-2, weight_decay: 0.1, grad_clip: 1.0}}
schedule: {{name: constant}}
training: {{steps: 3, progress: lines, resume: never}}
)",
                                       fmt::arg("run", tmp / name), fmt::arg("data", tmp.path()),
                                       fmt::arg("tiling", tiling));
  testing::write_text(tmp / (name + ".yaml"), text);
  Trainer t(load_train_config(tmp / (name + ".yaml")));
  EXPECT_EQ(t.run(), Trainer::Outcome::Finished);
  Trained out;
  for (const auto& r : t.history()) out.losses.push_back(r.loss);
  for (const auto& u : t.model().flat_units())
    out.params.push_back(tensor::to_float_vector(u.params));
  return out;
}

TEST(TiledTraining, GptTwoWithTiledLinearsKeepsTheUntiledBits) {
  ScratchDir tmp;
  testing::write_raw_shard(tmp / "train_000000.bin", {testing::pattern_tokens(3000, 200, 1)});
  const Trained plain = train(tmp, "plain", 1);
  ASSERT_EQ(plain.losses.size(), 3u);
  // 5 tiles: c_attn's 144 output features, c_fc's 192 and the 48 of the projections split
  // unevenly; 48 tiles: one input or output feature of the projections per tile.
  for (int tiling : {5, 48}) {
    SCOPED_TRACE(fmt::format("tiling {}", tiling));
    const Trained tiled = train(tmp, fmt::format("tiled{}", tiling), tiling);
    ASSERT_EQ(tiled.losses.size(), plain.losses.size());
    for (size_t i = 0; i < plain.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&plain.losses[i], &tiled.losses[i], sizeof(float)), 0)
          << "step " << i + 1 << ": " << plain.losses[i] << " vs " << tiled.losses[i];
    ASSERT_EQ(tiled.params.size(), plain.params.size());
    for (size_t u = 0; u < plain.params.size(); ++u)
      EXPECT_TRUE(plain.params[u] == tiled.params[u]) << "unit " << u;
  }
}

}  // namespace
}  // namespace strata::runtime
