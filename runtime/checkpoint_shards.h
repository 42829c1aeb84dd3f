#pragma once
// Flat shards: how checkpoints store state that ZeRO partitions across data-parallel ranks, and
// how a run on a different number of ranks reads it back.
//
// Note [Flat shards]
// Every piece of model or optimizer state is addressed in *flat coordinates*: (unit, key,
// [begin, end)) where unit is a flat unit's name ("embeddings", "h.3", "head"), key is "param" or
// an optimizer state name ("exp_avg", "exp_avg_sq", "momentum_buffer"), and the range is in
// elements of the unit's flat buffer as flatten_parameters laid it out. The unit's *extent* is
// the end of its last parameter: everything past it is padding (alignment, or the padding a
// data-parallel layout adds), zero by Note [Flat parameters], and never stored. A rank writes
// the slices it owns; a shard file is a safetensors file whose metadata "shards" (JSON) gives,
// for each tensor, its unit, key, the unit's extent and begin. Whole-model files
// (model.safetensors, by parameter name) are read through the same index: each parameter is a piece
// at its offset, and the alignment gaps between parameters are zero pieces. Loading asks the index
// to fill a destination range; the index copies from every piece that overlaps it, zeroes what lies
// beyond the extent, and fails naming the files when part of the range is covered by no piece. So
// any checkpoint — one process, plain DP, any ZeRO stage, any dp size — loads into any layout.
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace strata::parallel {
class Engine;
}

namespace strata::runtime {

struct FlatShard {
  std::string unit;
  std::string key;  // "param" or an optimizer state name
  int64_t begin = 0;
  tensor::Tensor data;  // F32, 1-d, numel() elements starting at `begin` (may run past the extent)
};

// The end of the unit's last parameter (Note [Flat shards]).
int64_t unit_extent(const models::FlatUnit& unit);

// Shards known by their place and size, their data produced in pieces (Note [Streamed shards]
// in parallel/engine.h): produce(emit) calls emit(i, piece) with the next piece.numel() elements
// of shards[i], each shard's pieces in order and all of them, shards interleaved as they come.
struct FlatShardInfo {
  std::string unit;
  std::string key;
  int64_t begin = 0;
  int64_t numel = 0;  // may run past the extent
  DType dtype = DType::F32;
};
struct FlatShardStream {
  using Emit = std::function<void(size_t shard, const tensor::Tensor& piece)>;
  std::vector<FlatShardInfo> shards;
  std::function<void(const Emit&)> produce;
  bool empty() const { return shards.empty(); }
};

// The engine's shards of this rank as a stream: its "param" shards (`params`) or the others
// (Note [Streamed shards] in parallel/engine.h); empty when it writes none.
FlatShardStream engine_shard_stream(parallel::Engine& engine, bool params);

// Writes `shards` of `model`'s units to `path` as a shard file (Note [Flat shards]); `metadata`
// is added to the file's metadata. Elements past a unit's extent (padding) are not written.
void save_flat_shards(const std::string& path, const models::CausalLM& model,
                      const std::vector<FlatShard>& shards,
                      const std::map<std::string, std::string>& metadata);
// The same file from a stream, written as its pieces come (Note [Streamed safetensors]): host
// memory holds a piece at a time, whatever the shards' size.
void save_flat_shards(const std::string& path, const models::CausalLM& model,
                      const FlatShardStream& stream,
                      const std::map<std::string, std::string>& metadata);

class FlatShardIndex {
 public:
  // Indexes every shard file given, and whole-model files by the layout of `model`'s flat
  // units. Validates headers and metadata (a unit or parameter the model does not have, a
  // unit_numel that differs: errors naming the file).
  FlatShardIndex(const models::CausalLM& model, const std::vector<std::string>& whole_model_files,
                 const std::vector<std::string>& shard_files);

  // True when [begin, begin+numel) of (unit, key), clipped to the extent, is fully covered.
  bool covers(const std::string& unit, const std::string& key, int64_t begin, int64_t numel) const;
  // Fills dst (F32, 1-d, contiguous) with [begin, begin + dst.numel()) of (unit, key); elements
  // at or past the unit's extent become zero. strata::user_error naming the checkpoint when not
  // covered.
  void fill(const std::string& unit, const std::string& key, int64_t begin,
            tensor::Tensor dst) const;
  // The keys present for a unit (e.g. to check an optimizer's state names).
  std::vector<std::string> keys(const std::string& unit) const;
  const std::string& description() const { return description_; }

 private:
  struct Piece {
    int file = -1;     // index into files_; -1 = zeros (alignment gap)
    std::string name;  // tensor name in the file
    int64_t begin = 0;
    int64_t numel = 0;
  };
  bool index_group_file(const tensor::SafetensorsReader& reader, int file,
                        const models::CausalLM& model);

  std::vector<std::string> files_;
  // fill()'s: each file's header (read and checked once), and the (file, tensor)s checked
  // against their digests before a read of part of them.
  mutable std::map<int, tensor::SafetensorsReader> readers_;
  mutable std::set<std::pair<int, std::string>> verified_;
  std::map<std::string, int64_t> unit_numel_;
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> pieces_;
  std::string description_;
};

}  // namespace strata::runtime
