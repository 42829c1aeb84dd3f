#include "data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/support/temp_dir.h"
#include "data/bpe_tokenizer.h"
#include "data/unicode.h"

namespace strata::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_bytes;

const std::string kBpeDir = std::string(STRATA_SOURCE_DIR) + "/tests/reference/bpe_small/";

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->name(), "byte");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eot_token(), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  all += "héllo\n\xff\xfe";
  std::vector<int32_t> ids = tok->encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), all);
}

TEST(ByteTokenizer, InvalidIdsDecodeToReplacementCharacter) {
  auto tok = make_byte_tokenizer();
  const std::vector<int32_t> ids = {'a', 256, 'b', -1};
  EXPECT_EQ(tok->decode(ids),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
}

TEST(MakeTokenizer, ByNameAndErrors) {
  EXPECT_EQ(make_tokenizer("byte", "", "")->name(), "byte");
  EXPECT_EQ(make_tokenizer("gpt2", kBpeDir + "vocab.json", kBpeDir + "merges.txt")->name(), "gpt2");
  EXPECT_THAT(error_of([] { make_tokenizer("sentencepiece", "", ""); }),
              AllOf(HasSubstr("sentencepiece"), HasSubstr("byte or gpt2")));
  EXPECT_THAT(error_of([] { make_tokenizer("gpt2", "", ""); }), HasSubstr("merges.txt"));
  EXPECT_THAT(error_of([] { make_tokenizer("byte", "v.json", ""); }), HasSubstr("v.json"));
}

class Gpt2Reference : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream in(kBpeDir + "reference.json");
    ASSERT_TRUE(in) << kBpeDir << "reference.json (run tests/reference/gen_bpe_reference.py)";
    ref_ = nlohmann::json::parse(in);
    tok_ = make_gpt2_tokenizer(kBpeDir + "vocab.json", kBpeDir + "merges.txt");
  }
  nlohmann::json ref_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Gpt2Reference, PreTokenizerMatchesTheRegex) {
  ASSERT_GE(ref_["cases"].size(), 20u);
  for (const auto& c : ref_["cases"]) {
    const std::string text = c["text"];
    std::vector<std::string> pieces;
    for (std::string_view p : gpt2_pretokenize(text)) pieces.emplace_back(p);
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << text;
  }
}

TEST_F(Gpt2Reference, EncodingMatchesHuggingFaceAndOpenAI) {
  EXPECT_EQ(tok_->vocab_size(), ref_["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok_->eot_token(), ref_["eot"].get<int32_t>());
  EXPECT_EQ(tok_->name(), "gpt2");
  for (int pass = 0; pass < 2; ++pass) {  // the second pass is served from the piece cache
    for (const auto& c : ref_["cases"]) {
      const std::string text = c["text"];
      const std::vector<int32_t> ids = tok_->encode(text);
      EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << text;
      EXPECT_EQ(tok_->decode(ids), text);
    }
  }
}

TEST_F(Gpt2Reference, RoundTripsBytesThatAreNotUtf8) {
  const std::string s = "ok \xff\xfe bad \xc3 trunc \xe2\x82 over \xc0\xaf \xed\xa0\x80 end";
  const std::vector<int32_t> ids = tok_->encode(s);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok_->vocab_size());
  EXPECT_EQ(tok_->decode(ids), s);
}

// Byte-level BPE encodes any bytes and decodes them back exactly: random strings built from the
// pieces the pre-tokenizer splits on (letters, digits, spaces and newlines, contractions,
// punctuation), multi-byte UTF-8 of several scripts, and bytes that are not UTF-8 (lone
// continuation and lead bytes, overlong and surrogate encodings, 0xff; and any byte, NUL
// included, one time in eight), 3000 of them from a fixed seed.
TEST_F(Gpt2Reference, RoundTripsRandomBytes) {
  static const char* kPieces[] = {
      "a",        "Z",        "hello",        " world", "  ",  "\n",   "\r\n", "\t",
      "0",        "12345",    "'s",           "'re",    "'LL", "!",    "?!",   "...",
      "\"",       "é",        "中文",         "Ω",      "😀",   "\xff", "\xc3", "\x80",
      "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80", " 's",    "\x7f"};
  uint64_t state = 20261125;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const uint64_t n = next() % 40;
    for (uint64_t k = 0; k < n; ++k) {
      if (next() % 8 == 0)
        text += static_cast<char>(next() % 256);  // any byte
      else
        text += kPieces[next() % std::size(kPieces)];
    }
    const std::vector<int32_t> ids = tok_->encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->vocab_size()) << id;
    ASSERT_EQ(tok_->decode(ids), text) << "string " << i;
  }
}

TEST_F(Gpt2Reference, InvalidIdsDecodeToReplacementCharacter) {
  const std::vector<int32_t> ids = {tok_->encode("a")[0], 1000, -5};
  EXPECT_EQ(tok_->decode(ids), "a\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{tok_->eot_token()}), "<|endoftext|>");
}

TEST(Gpt2ByteTable, MatchesOpenAIBytesToUnicode) {
  EXPECT_EQ(gpt2_byte_to_unicode('!'), static_cast<uint32_t>('!'));
  EXPECT_EQ(gpt2_byte_to_unicode(0), 0x100u);
  EXPECT_EQ(gpt2_byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_unicode(0xAD), 0x143u);  // soft hyphen, the last shifted byte
  EXPECT_EQ(gpt2_byte_to_unicode(0xFF), 0xFFu);
}

class Gpt2Files : public ::testing::Test {
 protected:
  std::string vocab_text() const { return testing::read_bytes(kBpeDir + "vocab.json"); }
  std::string merges_text() const { return testing::read_bytes(kBpeDir + "merges.txt"); }
  std::string load_error(const std::string& vocab, const std::string& merges) {
    write_bytes(dir_.file("vocab.json"), vocab);
    write_bytes(dir_.file("merges.txt"), merges);
    return error_of([&] { make_gpt2_tokenizer(dir_.file("vocab.json"), dir_.file("merges.txt")); });
  }
  TempDir dir_;
};

TEST_F(Gpt2Files, CopiesLoad) {
  EXPECT_EQ(load_error(vocab_text(), merges_text()), "(no error)");
}

TEST_F(Gpt2Files, MissingFilesAreNamed) {
  EXPECT_THAT(
      error_of([&] { make_gpt2_tokenizer(dir_.file("none.json"), kBpeDir + "merges.txt"); }),
      AllOf(HasSubstr(dir_.file("none.json")), HasSubstr("cannot open")));
  EXPECT_THAT(error_of([&] { make_gpt2_tokenizer(kBpeDir + "vocab.json", dir_.file("none.txt")); }),
              AllOf(HasSubstr(dir_.file("none.txt")), HasSubstr("cannot open")));
}

TEST_F(Gpt2Files, MalformedVocabIsNamed) {
  EXPECT_THAT(load_error("{\"a\": 0,", merges_text()),
              AllOf(HasSubstr(dir_.file("vocab.json")), HasSubstr("not valid JSON")));
  EXPECT_THAT(load_error("[1, 2]", merges_text()), HasSubstr(dir_.file("vocab.json")));
  EXPECT_THAT(load_error("{\"a\": \"x\"}", merges_text()),
              AllOf(HasSubstr(dir_.file("vocab.json")), HasSubstr("token 'a'")));
  EXPECT_THAT(load_error("{\"a\": -1}", merges_text()),
              AllOf(HasSubstr(dir_.file("vocab.json")), HasSubstr("token 'a' has id -1")));
  // An id of a billion would size the id table at 32 GB (it once threw std::bad_alloc); one
  // below the limit is a sparse vocabulary, and is then refused only for its missing bytes.
  EXPECT_THAT(load_error("{\"a\": 1000000000}", merges_text()),
              AllOf(HasSubstr(dir_.file("vocab.json")),
                    HasSubstr("token 'a' has id 1000000000, expected an integer from 0 to "
                              "4194303")));
  EXPECT_THAT(load_error("{\"a\": 4194303}", merges_text()), HasSubstr("byte 0x00 has no token"));
  // Only ASCII letters: most bytes have no token.
  EXPECT_THAT(load_error("{\"a\": 0, \"b\": 1}", merges_text()),
              AllOf(HasSubstr(dir_.file("vocab.json")), HasSubstr("byte 0x00 has no token")));
}

TEST_F(Gpt2Files, MalformedMergesNameFileAndLine) {
  EXPECT_THAT(load_error(vocab_text(), "#version: 0.2\nĠ t\nthree parts here\n"),
              AllOf(HasSubstr(dir_.file("merges.txt") + ":3"), HasSubstr("three parts here")));
  EXPECT_THAT(load_error(vocab_text(), "#version: 0.2\nnospace\n"),
              HasSubstr(dir_.file("merges.txt") + ":2"));
  // A merge whose result is not in the vocabulary: the files do not belong together.
  EXPECT_THAT(load_error(vocab_text(), "#version: 0.2\nĠ t\nq z\n"),
              AllOf(HasSubstr(dir_.file("merges.txt") + ":3"), HasSubstr("same model")));
}

// Samples printed to the console (unicode::printable): valid UTF-8, newlines and tabs stay; a
// malformed byte and a control character each become one U+FFFD.
TEST(Printable, KeepsValidTextAndReplacesMalformedBytesAndControls) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::printable("plain text\n\tindented"), "plain text\n\tindented");
  EXPECT_EQ(unicode::printable("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");  // 2-, 3- and 4-byte sequences
  EXPECT_EQ(unicode::printable(std::string("a\x96") + "b"), "a" + fffd + "b");  // stray byte
  EXPECT_EQ(unicode::printable("x\xE2\x82"), "x" + fffd + fffd);          // a sequence cut short
  EXPECT_EQ(unicode::printable("\x1b[2Jred\r"), fffd + "[2Jred" + fffd);  // escape, return
  EXPECT_EQ(unicode::printable(std::string("a\0b\x7f", 4)), "a" + fffd + "b" + fffd);
  EXPECT_EQ(unicode::printable("\xC2\x85"), fffd);  // U+0085, a C1 control
  EXPECT_EQ(unicode::printable(""), "");
}

}  // namespace
}  // namespace strata::data
