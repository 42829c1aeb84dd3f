#pragma once
// Tokenizers: text <-> token ids, for `tokenize` (making shards) and `generate` (prompts, output).
//
// Two are built in: "byte" (ids are the UTF-8 bytes, vocabulary 256, no end-of-text token) and
// "gpt2" (OpenAI's byte-level BPE, from the vocab.json + merges.txt a user has from Hugging Face;
// see bpe_tokenizer.h). Both are lossless: decode(encode(s)) == s for every byte string s.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Plain text: special-token strings such as "<|endoftext|>" in it are encoded as ordinary text.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Concatenates the ids' bytes; an id outside the vocabulary becomes U+FFFD. Bytes are returned
  // as they are, so decoding one id of a multi-byte character gives a partial UTF-8 sequence.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t eot_token() const = 0;  // -1 when none
  virtual std::string name() const = 0;   // "byte" | "gpt2"
};

// UTF-8 encoding of U+FFFD REPLACEMENT CHARACTER.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

std::unique_ptr<Tokenizer> make_byte_tokenizer();  // ids = bytes, vocab 256, no EOT
// GPT-2 byte-level BPE from the vocab.json + merges.txt a user has from Hugging Face;
// EOT = <|endoftext|>. strata::user_error naming the file when either is missing or malformed.
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_json,
                                               const std::string& merges_txt);
// By name: "byte" (vocab and merges must be empty) or "gpt2" (both required).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab,
                                          const std::string& merges);

}  // namespace strata::data
