#pragma once
// GPT-2 byte-level BPE, exactly as OpenAI's encoder.py (and Hugging Face's GPT-2 tokenizer).
//
// Note [GPT-2 BPE]
// 1. Pre-tokenize the text with the pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    implemented by hand in gpt2_pretokenize (no regex library); classes as in Note [Unicode
//    classes]. Bytes that are not valid UTF-8 count as "other" one byte at a time (the regex
//    never sees them in Python, which works on decoded text).
// 2. Each piece's bytes start as single-byte tokens; the adjacent pair with the lowest merge
//    rank (its line in merges.txt) is merged everywhere in the piece, left to right, until no
//    pair has a rank. vocab.json and merges.txt spell bytes through OpenAI's bytes_to_unicode
//    table (printable bytes as themselves, the rest shifted to U+0100..); they are translated
//    back to raw bytes at load, so BPE works on token ids: a merge is (left id, right id) ->
//    merged id. When a pair appears twice in merges.txt the later rank wins, as in both
//    reference implementations.
// 3. Results are cached per piece: natural text repeats a small set of words.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace strata::data {

// The pre-tokenizer pieces of `text`, in order; concatenated they give `text` back.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// OpenAI's bytes_to_unicode: the code point that stands for byte b in vocab.json / merges.txt.
uint32_t gpt2_byte_to_unicode(uint8_t b);

class BpeTokenizer final : public Tokenizer {
 public:
  // Loads and validates both files; strata::user_error naming the file (and line) on problems.
  BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_bytes_.size()); }
  int32_t eot_token() const override { return eot_; }
  std::string name() const override { return "gpt2"; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct Cache;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::vector<std::string> id_to_bytes_;  // raw bytes of each id; empty for an unused id
  std::vector<bool> id_used_;
  int32_t byte_ids_[256];
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t eot_ = -1;
  std::unique_ptr<Cache> cache_;
};

}  // namespace strata::data
