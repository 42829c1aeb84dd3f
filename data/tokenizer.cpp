#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe_tokenizer.h"

namespace strata::data {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        out.push_back(static_cast<char>(id));
      } else {
        out.append(kReplacementChar);
      }
    }
    return out;
  }
  int32_t vocab_size() const override { return 256; }
  int32_t eot_token() const override { return -1; }
  std::string name() const override { return "byte"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_json,
                                               const std::string& merges_txt) {
  return std::make_unique<BpeTokenizer>(vocab_json, merges_txt);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab,
                                          const std::string& merges) {
  if (name == "byte") {
    STRATA_USER_CHECK(vocab.empty() && merges.empty(),
                      "the byte tokenizer takes no vocab/merges files (got '{}', '{}'); drop them "
                      "or use the gpt2 tokenizer",
                      vocab, merges);
    return make_byte_tokenizer();
  }
  if (name == "gpt2") {
    STRATA_USER_CHECK(!vocab.empty() && !merges.empty(),
                      "the gpt2 tokenizer needs both a vocab.json and a merges.txt (e.g. from the "
                      "Hugging Face gpt2 model: --vocab vocab.json --merges merges.txt)");
    return make_gpt2_tokenizer(vocab, merges);
  }
  user_error("unknown tokenizer '{}'; choose byte or gpt2", name);
}

}  // namespace strata::data
