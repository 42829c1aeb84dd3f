// GPT-2 initialisation (Note [GPT-2 init], Note [Name-keyed init]).
#include <gtest/gtest.h>

#include <cmath>

#include "models/gpt2/gpt2.h"
#include "models/nn/init.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

using gpt2::GPT2;
using gpt2::GPT2Config;

GPT2Config config(int64_t layers = 4) {
  GPT2Config c = gpt2::preset("gpt2-tiny");
  c.n_embd = 128;
  c.n_layer = layers;
  c.vocab_size = 500;
  c.padded_vocab_size = 512;
  return c;
}

struct Stats {
  double mean = 0, std = 0;
};

Stats stats(const tensor::Tensor& t) {
  std::vector<float> v = tensor::to_float_vector(t);
  double s = 0, ss = 0;
  for (float x : v) s += x;
  double mean = s / static_cast<double>(v.size());
  for (float x : v) ss += (x - mean) * (x - mean);
  return {mean, std::sqrt(ss / static_cast<double>(v.size()))};
}

TEST(Gpt2Init, DistributionsFollowGpt2) {
  const GPT2Config c = config();
  GPT2 model(c, 42);
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, p] : model.named_parameters()) {
    SCOPED_TRACE(name);
    tensor::Tensor data = p.data();
    if (name == "wte.weight") data = data.narrow(0, 0, c.vocab_size);
    Stats s = stats(data);
    const bool is_bias = name.ends_with(".bias");
    const bool is_ln = name.find("ln_") != std::string::npos;
    if (is_bias) {
      EXPECT_EQ(s.mean, 0.0);
      EXPECT_EQ(s.std, 0.0);
    } else if (is_ln) {
      EXPECT_EQ(s.mean, 1.0);
      EXPECT_EQ(s.std, 0.0);
    } else {
      const double expected =
          name.ends_with("c_proj.weight") ? resid_std : 0.02;  // residual projections scaled
      const double n = static_cast<double>(data.numel());
      EXPECT_NEAR(s.mean, 0.0, 5 * expected / std::sqrt(n));
      EXPECT_NEAR(s.std, expected, 5 * expected / std::sqrt(2 * n));
    }
  }
  // Padded vocabulary rows are zero (Note [Padded vocabulary]).
  tensor::Tensor pad =
      model.wte().weight().data().narrow(0, c.vocab_size, c.padded_vocab_size - c.vocab_size);
  EXPECT_EQ(tensor::l2_norm(pad), 0.0);
}

TEST(Gpt2Init, DeterministicAndKeyedByName) {
  GPT2 a(config(4), 7), b(config(4), 7), other_seed(config(4), 8), deeper(config(6), 7);
  for (auto& [name, p] : a.named_parameters()) {
    SCOPED_TRACE(name);
    std::vector<float> va = tensor::to_float_vector(p.data());
    EXPECT_EQ(va, tensor::to_float_vector(b.parameter(name).data()));
    if (!name.ends_with(".bias") && name.find("ln_") == std::string::npos) {
      EXPECT_NE(va, tensor::to_float_vector(other_seed.parameter(name).data()));
    }
    // A model with more layers has the same values for every parameter name it shares, except
    // the residual projections, whose std depends on the depth.
    if (!name.ends_with("c_proj.weight")) {
      EXPECT_EQ(va, tensor::to_float_vector(deeper.parameter(name).data()));
    }
  }
  // Different parameters of the same shape draw different values.
  EXPECT_NE(tensor::to_float_vector(a.parameter("h.0.mlp.c_fc.weight").data()),
            tensor::to_float_vector(a.parameter("h.1.mlp.c_fc.weight").data()));
}

TEST(Gpt2Init, ResetParametersReproducesConstruction) {
  GPT2 a(config(2), 3);
  std::vector<std::vector<float>> before;
  for (auto& p : a.parameters()) before.push_back(tensor::to_float_vector(p.data()));
  for (FlatUnit& u : a.flat_units()) u.params.fill_(0.25);
  a.reset_parameters(3);
  size_t k = 0;
  for (auto& p : a.parameters()) EXPECT_EQ(before[k++], tensor::to_float_vector(p.data()));
}

TEST(NameKeyedInit, HashIsStable) {
  // FNV-1a test vectors: the key of a name must never change between builds.
  EXPECT_EQ(nn::init::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(nn::init::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(nn::init::fnv1a64("foobar"), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace strata::models
