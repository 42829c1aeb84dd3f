// Runs the `tokenize` binary end to end and reads back the shards it writes.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace strata::tools {
using namespace strata::data;
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_bytes;

struct Result {
  int exit_code;
  std::string out, err;
};

Result run_tokenize(const TempDir& dir, const std::string& args) {
  const std::string cmd = std::string(STRATA_BINARY_DIR) + "/tokenize " + args + " >" +
                          dir.file("stdout.txt") + " 2>" + dir.file("stderr.txt");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_bytes(dir.file("stdout.txt")),
          testing::read_bytes(dir.file("stderr.txt"))};
}

std::vector<uint16_t> shard_tokens(const std::string& path) {
  TokenShard shard(path);
  return {shard.data(), shard.data() + shard.size()};
}

std::vector<uint16_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()),
          reinterpret_cast<const uint8_t*>(s.data()) + s.size()};
}

// Five fortunes, the way /usr/share/games/fortunes holds them, plus the binary index beside them.
class TokenizeFortunes : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directory(dir_.path() / "in");
    write_bytes(dir_.file("in/jokes"), "one\n%\ntwo lines\nof text\n%\nthree\n%\nfour\n%\nfive\n");
    write_bytes(dir_.file("in/jokes.dat"), std::string("\x00\x00\x00\x02\xff", 5));
  }
  const std::vector<std::string> docs_ = {"one\n", "two lines\nof text\n", "three\n", "four\n",
                                          "five\n"};
  TempDir dir_;
};

TEST_F(TokenizeFortunes, ByteTokenizerSplitsDocumentsDeterministically) {
  Result r = run_tokenize(dir_, "--tokenizer byte --format fortune --val-fraction 0.5 --output " +
                                    dir_.file("out") + " " + dir_.file("in"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("documents: 5 (train 3, val 2)"),
                           HasSubstr("train_000000.bin"), HasSubstr("val_000000.bin")));
  // Every 2nd document goes to val; each document is followed by a "\n" separator.
  std::string train = docs_[0] + "\n" + docs_[2] + "\n" + docs_[4] + "\n";
  std::string val = docs_[1] + "\n" + docs_[3] + "\n";
  EXPECT_EQ(shard_tokens(dir_.file("out/train_000000.bin")), bytes_of(train));
  EXPECT_EQ(shard_tokens(dir_.file("out/val_000000.bin")), bytes_of(val));
  EXPECT_EQ(TokenShard(dir_.file("out/train_000000.bin")).vocab_size_hint(), 256);
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out/train_000001.bin")));
}

TEST_F(TokenizeFortunes, Gpt2ShardsFillInOrderAndEndDocumentsWithEot) {
  const std::string bpe = std::string(STRATA_SOURCE_DIR) + "/tests/reference/bpe_small/";
  // A stale shard from an earlier, larger run must not survive.
  std::filesystem::create_directory(dir_.path() / "out");
  write_token_shard(dir_.file("out/train_000009.bin"), std::vector<uint16_t>{1, 2}, 0);
  Result r = run_tokenize(dir_, "--tokenizer gpt2 --vocab " + bpe + "vocab.json --merges " + bpe +
                                    "merges.txt --format fortune --val-fraction 0 "
                                    "--shard-tokens 4 --output " +
                                    dir_.file("out") + " " + dir_.file("in/jokes"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto tok = make_gpt2_tokenizer(bpe + "vocab.json", bpe + "merges.txt");
  std::vector<uint16_t> expected;
  for (const std::string& d : docs_) {
    for (int32_t id : tok->encode(d)) expected.push_back(static_cast<uint16_t>(id));
    expected.push_back(static_cast<uint16_t>(tok->eot_token()));
  }
  std::vector<uint16_t> got;
  size_t shards = 0;
  for (; std::filesystem::exists(dir_.file(fmt::format("out/train_{:06d}.bin", shards)));
       ++shards) {
    auto t = shard_tokens(dir_.file(fmt::format("out/train_{:06d}.bin", shards)));
    EXPECT_LE(t.size(), 4u);
    EXPECT_EQ(TokenShard(dir_.file(fmt::format("out/train_{:06d}.bin", shards))).vocab_size_hint(),
              1000);
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(shards, (expected.size() + 3) / 4);
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out/train_000009.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out/val_000000.bin")));
}

TEST_F(TokenizeFortunes, ErrorsNameThePathAndExitWithOne) {
  Result missing = run_tokenize(dir_, "--output " + dir_.file("out") + " " + dir_.file("nope.txt"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, AllOf(HasSubstr("tokenize: error:"), HasSubstr(dir_.file("nope.txt"))));

  // The output directory cannot be created: a file is in the way.
  Result blocked =
      run_tokenize(dir_, "--output " + dir_.file("in/jokes") + "/sub " + dir_.file("in/jokes"));
  EXPECT_EQ(blocked.exit_code, 1);
  EXPECT_THAT(blocked.err, AllOf(HasSubstr("tokenize: error:"), HasSubstr(dir_.file("in/jokes"))));

  Result no_merges = run_tokenize(dir_, "--tokenizer gpt2 --vocab " + dir_.file("v.json") +
                                            " --merges " + dir_.file("m.txt") + " --output " +
                                            dir_.file("out") + " " + dir_.file("in/jokes"));
  EXPECT_EQ(no_merges.exit_code, 1);
  EXPECT_THAT(no_merges.err, HasSubstr(dir_.file("v.json")));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out/train_000000.bin")));

  Result usage = run_tokenize(dir_, dir_.file("in/jokes"));  // --output missing
  EXPECT_EQ(usage.exit_code, 1);
  EXPECT_THAT(usage.err, HasSubstr("--output"));
}

}  // namespace
}  // namespace strata::tools
