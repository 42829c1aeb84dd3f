#pragma once
// The data loader: fixed-length training windows from token shards, in a deterministic order.
//
// Note [Data order]
// Sample k of an epoch is the window of T+1 tokens starting at token T*j of shard s, for all
// (s, j) with T*j + T + 1 <= size(s), in shard-then-offset order: shards sorted by name, windows
// never cross a shard boundary, and tail tokens that do not fill a window are unused. A window
// gives ids = tokens[T*j, T*j+T) and targets = tokens[T*j+1, T*j+T+1). Consecutive windows
// overlap by one token (the last target of one is the first id of the next), as in llm.c.
//
// With shuffle on, epoch e visits the samples in a permutation drawn by Fisher–Yates, the swap
// partner of position i being a Philox draw at counter i under the key (seed, stream(e)) — a pure
// function of (seed, e, num_samples), the same on every machine and thread count (Note
// [Deterministic RNG]). Without shuffle every epoch is the identity order.
//
// A position in the data is therefore one integer, the number of samples consumed. Global
// sample index g lies in epoch g / num_samples at slot g % num_samples. The trainer asks for
// samples [step*G + r*M*A + m*M, ... + M) (G global batch, M micro batch, A accumulation steps,
// r the dp rank, m the micro step), so the order does not depend on the dp size and a resumed
// run reads exactly the samples an uninterrupted one would.
//
// Token ids are checked against the model's vocabulary as batches are read (a whole-corpus scan
// at start-up would cost minutes on large data); shards whose header records a larger vocabulary
// are rejected up front (Note [Token shard format]).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "data/token_shard.h"

namespace strata::data {

struct DataLoaderOptions {
  std::string pattern;      // glob of shards (sorted by name); the config key names it in errors
  std::string config_key;   // e.g. "data.train", used in error messages
  std::string config_file;  // the config file that sets it, named in errors too ("" if none)
  int64_t seq_len = 0;      // T
  int64_t vocab_size = 0;   // the model's; every token must be < it
  bool shuffle = false;
  uint64_t seed = 0;
};

struct Batch {
  tensor::Tensor ids, targets;  // both I32 [n, T]; targets = ids shifted by one
};

class DataLoader {
 public:
  // Globs, opens every shard, checks vocab hints; strata::user_error on anything wrong.
  explicit DataLoader(DataLoaderOptions options);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  int64_t num_samples() const { return num_samples_; }  // samples in one epoch
  // Samples [first, first + n) of the deterministic order; first may run past one epoch (it
  // wraps into epoch first / num_samples, reshuffled when shuffle is on). See Note [Data order].
  Batch batch(int64_t first, int64_t n) const;
  const std::vector<std::string>& files() const { return files_; }
  const DataLoaderOptions& options() const { return options_; }

  // The sample (index into the unshuffled epoch order) at global position g.
  int64_t sample_at(int64_t g) const;

 private:
  struct PermutationCache;
  // Epoch e's order; cached because consecutive batches nearly always share an epoch.
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

  DataLoaderOptions options_;
  std::vector<std::string> files_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_sample_;  // first_sample_[s] = windows in shards before s; +1 entry
  int64_t num_samples_ = 0;
  std::unique_ptr<PermutationCache> cache_;
};

// The Fisher–Yates permutation of [0, n) for (seed, epoch) described in Note [Data order].
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace strata::data
