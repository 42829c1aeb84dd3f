#pragma once
// Token shards: the .bin format llm.c and nanoGPT users already have.
//
// Note [Token shard format]
// A header of 256 little-endian int32 — header[0] = 20240520 (magic), header[1] = 1 (version),
// header[2] = number of tokens — then that many little-endian uint16 tokens. Strata also writes
// header[3] = the vocabulary size of the tokenizer that made the shard (0 = unknown; llm.c
// ignores it), so a data/model vocabulary mismatch is caught before training instead of as an
// out-of-range embedding lookup. Readers mmap the file read-only and validate the whole header
// up front; writers go through a temporary name, fsync and rename (docs/design.md decision 12).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace strata::data {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderInts = 256;
inline constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;

class TokenShard {
 public:
  // Maps and validates `path`; strata::user_error naming the file on anything malformed.
  explicit TokenShard(std::string path);
  ~TokenShard();
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&& o) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens
  const uint16_t* data() const { return tokens_; }
  // header[3]: the writer's vocabulary size, 0 when unknown.
  int32_t vocab_size_hint() const { return vocab_size_hint_; }

 private:
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
  int32_t vocab_size_hint_ = 0;
};

// Writes a shard atomically: temporary name in the same directory, fsync, rename.
// vocab_size goes into header[3] (0 = unknown).
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens,
                       int32_t vocab_size);

}  // namespace strata::data
