#include "data/data_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "core/error.h"
#include "tests/support/temp_dir.h"

namespace strata::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;

std::vector<uint16_t> iota_tokens(int n, int start) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(start + i);
  return t;
}

std::vector<int32_t> row(const tensor::Tensor& t, int64_t i) {
  const int64_t T = t.size(1);
  const int32_t* p = t.data<int32_t>() + i * T;
  return {p, p + T};
}

DataLoaderOptions options(const TempDir& dir, int64_t T, int64_t vocab = 1000) {
  DataLoaderOptions o;
  o.pattern = dir.file("train_*.bin");
  o.config_key = "data.train";
  o.seq_len = T;
  o.vocab_size = vocab;
  return o;
}

std::string error_of(const DataLoaderOptions& o) {
  try {
    DataLoader loader(o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

// Two shards written out of name order: b holds 10 tokens 0..9, a holds 7 tokens 100..106. Their
// headers record no vocabulary (0), like llm.c's, so only the token check can catch a mismatch.
// With T = 3, a gives windows j = 0, 1 (3j + 4 <= 7) and b gives j = 0, 1, 2 (3j + 4 <= 10).
class TwoShards : public ::testing::Test {
 protected:
  void SetUp() override {
    write_token_shard(dir_.file("train_b.bin"), iota_tokens(10, 0), 0);
    write_token_shard(dir_.file("train_a.bin"), iota_tokens(7, 100), 0);
  }
  TempDir dir_;
};

TEST_F(TwoShards, WindowsInShardThenOffsetOrder) {
  DataLoader loader(options(dir_, 3));
  EXPECT_EQ(loader.files(),
            (std::vector<std::string>{dir_.file("train_a.bin"), dir_.file("train_b.bin")}));
  ASSERT_EQ(loader.num_samples(), 5);
  Batch b = loader.batch(0, 5);
  EXPECT_EQ(b.ids.dtype(), DType::I32);
  EXPECT_EQ(b.ids.shape(), (tensor::Shape{5, 3}));
  EXPECT_EQ(b.targets.shape(), (tensor::Shape{5, 3}));
  const std::vector<std::vector<int32_t>> starts = {{100}, {103}, {0}, {3}, {6}};
  for (int64_t i = 0; i < 5; ++i) {
    const int32_t s = starts[i][0];
    EXPECT_EQ(row(b.ids, i), (std::vector<int32_t>{s, s + 1, s + 2})) << "sample " << i;
    EXPECT_EQ(row(b.targets, i), (std::vector<int32_t>{s + 1, s + 2, s + 3})) << "sample " << i;
  }
}

TEST_F(TwoShards, WrapsAroundIntoTheNextEpoch) {
  DataLoader loader(options(dir_, 3));
  Batch all = loader.batch(0, 5);
  Batch wrapped = loader.batch(3, 4);  // samples 3, 4, then 0, 1 of epoch 1
  EXPECT_EQ(row(wrapped.ids, 0), row(all.ids, 3));
  EXPECT_EQ(row(wrapped.ids, 1), row(all.ids, 4));
  EXPECT_EQ(row(wrapped.ids, 2), row(all.ids, 0));
  EXPECT_EQ(row(wrapped.targets, 3), row(all.targets, 1));
  Batch far = loader.batch(5 * 7 + 2, 1);  // epoch 7, slot 2
  EXPECT_EQ(row(far.ids, 0), row(all.ids, 2));
}

TEST_F(TwoShards, TokenOutsideTheVocabularyNamesShardOffsetIdAndVocab) {
  // Tokens 100..106 in train_a: 105 is the first >= 105, at offset 5 (the second window).
  DataLoader loader(options(dir_, 3, /*vocab=*/105));
  EXPECT_NO_THROW(loader.batch(2, 3));  // train_b only
  try {
    loader.batch(0, 2);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr(dir_.file("train_a.bin")), HasSubstr("token 105"),
                      HasSubstr("offset 5"), HasSubstr("105"), HasSubstr("data and model disagree"),
                      HasSubstr("tokenized with a larger vocabulary?")));
  }
}

TEST_F(TwoShards, VocabHintLargerThanTheModelFailsAtConstruction) {
  write_token_shard(dir_.file("train_c.bin"), iota_tokens(10, 0), 50257);
  EXPECT_THAT(error_of(options(dir_, 3, 1000)),
              AllOf(HasSubstr(dir_.file("train_c.bin")), HasSubstr("50257"), HasSubstr("1000"),
                    HasSubstr("data and model disagree")));
  EXPECT_EQ(error_of(options(dir_, 3, 50257)), "(no error)");
}

TEST_F(TwoShards, ShardTooShortForOneWindow) {
  // T = 7 needs 8 tokens: train_a has 7.
  EXPECT_THAT(error_of(options(dir_, 7)), AllOf(HasSubstr(dir_.file("train_a.bin")),
                                                HasSubstr("too short"), HasSubstr("seq_len 7")));
  EXPECT_EQ(error_of(options(dir_, 6)), "(no error)");
}

TEST(DataLoader, GlobMatchingNothingNamesKeyAndPatternAndSuggestsTokenize) {
  TempDir dir;
  DataLoaderOptions o = options(dir, 4);
  EXPECT_THAT(error_of(o),
              AllOf(HasSubstr("data.train"), HasSubstr(o.pattern), HasSubstr("tokenize")));
}

// A relative pattern is looked up from the working directory; the error says which one, and
// names the config file that set the key.
TEST(DataLoader, RelativeGlobMatchingNothingNamesTheConfigFileAndTheWorkingDirectory) {
  DataLoaderOptions o;
  o.pattern = "strata_no_such_dir/train_*.bin";
  o.config_key = "data.val";
  o.config_file = "configs/run.yaml";
  o.seq_len = 4;
  o.vocab_size = 1000;
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_THAT(error_of(o), AllOf(HasSubstr("configs/run.yaml: data.val: no token shards match "
                                           "'strata_no_such_dir/train_*.bin'"),
                                 HasSubstr("working directory '" + cwd + "'")));
  // An absolute pattern has no working directory to blame.
  TempDir dir;
  o.pattern = dir.file("train_*.bin");
  EXPECT_THAT(error_of(o),
              AllOf(HasSubstr("configs/run.yaml: data.val"), Not(HasSubstr("working directory"))));
}

// A directory that glob cannot open for a reason other than not existing (here a symlink loop,
// ELOOP even for root, who reads any directory whatever its mode) is named with the reason.
TEST(DataLoader, UnreadableDirectoryInTheGlobIsNamedWithTheReason) {
  TempDir dir;
  std::filesystem::create_directory_symlink(dir.file("loop"), dir.file("loop"));
  DataLoaderOptions o = options(dir, 4);
  o.pattern = dir.file("loop/train_*.bin");
  EXPECT_THAT(error_of(o), AllOf(HasSubstr("data.train: cannot expand '" + o.pattern + "'"),
                                 HasSubstr("directory '" + dir.file("loop") + "'"),
                                 HasSubstr(std::strerror(ELOOP))));
}

TEST(DataLoader, BadShardAndBadOptionsAreUserErrors) {
  TempDir dir;
  testing::write_bytes(dir.file("train_x.bin"), std::string(2000, 'x'));
  EXPECT_THAT(error_of(options(dir, 4)),
              AllOf(HasSubstr(dir.file("train_x.bin")), HasSubstr("not a token shard")));
  EXPECT_THAT(error_of(options(dir, 0)), AllOf(HasSubstr("data.train"), HasSubstr("seq_len")));
  EXPECT_THAT(error_of(options(dir, 4, 0)), AllOf(HasSubstr("data.train"), HasSubstr("vocab")));
}

// Many samples, so a shuffle is very unlikely to be the identity by chance.
class ManySamples : public ::testing::Test {
 protected:
  void SetUp() override {
    // Shard s holds tokens s*1000 + i; T = 4 gives 50 (first shard) + 37 + 70 windows.
    write_token_shard(dir_.file("train_0.bin"), iota_tokens(201, 0), 0);
    write_token_shard(dir_.file("train_1.bin"), iota_tokens(150, 1000), 0);
    write_token_shard(dir_.file("train_2.bin"), iota_tokens(283, 2000), 0);
  }
  DataLoaderOptions shuffled(uint64_t seed) const {
    DataLoaderOptions o = options(dir_, 4, 4000);
    o.shuffle = true;
    o.seed = seed;
    return o;
  }
  // First token of every sample in [first, first + n).
  static std::vector<int32_t> first_tokens(const DataLoader& l, int64_t first, int64_t n) {
    Batch b = l.batch(first, n);
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(row(b.ids, i)[0]);
    return out;
  }
  TempDir dir_;
};

TEST_F(ManySamples, ShuffleIsADeterministicPermutationPerEpoch) {
  DataLoader plain(options(dir_, 4, 4000));
  ASSERT_EQ(plain.num_samples(), 50 + 37 + 70);
  const int64_t n = plain.num_samples();
  std::vector<int32_t> unshuffled = first_tokens(plain, 0, n);

  DataLoader a(shuffled(42)), b(shuffled(42)), c(shuffled(43));
  std::vector<int32_t> a0 = first_tokens(a, 0, n), a1 = first_tokens(a, n, n);
  EXPECT_EQ(a0, first_tokens(b, 0, n));  // same seed, separate loaders: same order
  EXPECT_EQ(a1, first_tokens(b, n, n));
  EXPECT_NE(a0, unshuffled);
  EXPECT_NE(a0, a1);                     // reshuffled every epoch
  EXPECT_NE(a0, first_tokens(c, 0, n));  // and the seed matters
  for (const auto* epoch : {&a0, &a1}) {
    std::vector<int32_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, unshuffled) << "an epoch visits every sample exactly once";
  }
  // The loader's order is the documented Fisher–Yates permutation.
  const std::vector<int64_t> perm = epoch_permutation(n, 42, 1);
  for (int64_t k = 0; k < n; ++k) EXPECT_EQ(a1[k], unshuffled[perm[k]]) << k;
}

TEST_F(ManySamples, RankSlicesReassembleTheGlobalOrder) {
  // G = dp * M * A with dp = 3, M = 2, A = 4: each rank reads its slices of every step.
  const int64_t dp = 3, M = 2, A = 4, G = dp * M * A;
  DataLoader global(shuffled(7));
  for (int64_t step : {0, 5, 13}) {  // step 13 runs past the first epoch (157 samples)
    Batch whole = global.batch(step * G, G);
    for (int64_t r = 0; r < dp; ++r) {
      DataLoader rank_loader(shuffled(7));  // each rank is its own process
      for (int64_t m = 0; m < A; ++m) {
        const int64_t first = step * G + r * M * A + m * M;
        Batch micro = rank_loader.batch(first, M);
        for (int64_t i = 0; i < M; ++i) {
          EXPECT_EQ(row(micro.ids, i), row(whole.ids, first - step * G + i));
          EXPECT_EQ(row(micro.targets, i), row(whole.targets, first - step * G + i));
        }
      }
    }
  }
}

TEST_F(ManySamples, ResumedLoaderReadsWhatAnUninterruptedOneWould) {
  DataLoader running(shuffled(3));
  std::vector<int32_t> seen;
  for (int64_t pos = 0; pos < 400; pos += 8) {
    auto t = first_tokens(running, pos, 8);
    seen.insert(seen.end(), t.begin(), t.end());
  }
  DataLoader resumed(shuffled(3));  // restarted at position 200
  EXPECT_EQ(first_tokens(resumed, 200, 200), std::vector<int32_t>(seen.begin() + 200, seen.end()));
}

}  // namespace
}  // namespace strata::data
