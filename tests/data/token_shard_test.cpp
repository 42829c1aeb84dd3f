#include "data/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "tests/support/temp_dir.h"

namespace strata::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// A shard built by hand, byte by byte, so the reader is checked against the format itself.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, int32_t vocab,
                      const std::vector<uint16_t>& tokens) {
  std::array<int32_t, 256> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  header[3] = vocab;
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof(header));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

std::string error_of(const std::string& path) {
  try {
    TokenShard shard(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenShard, ReadsTheLlmcFormat) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {5, 0, 65535, 1234, 7};
  write_bytes(dir.file("a.bin"), raw_shard(20240520, 1, 5, 0, tokens));
  TokenShard shard(dir.file("a.bin"));
  EXPECT_EQ(shard.path(), dir.file("a.bin"));
  ASSERT_EQ(shard.size(), 5);
  EXPECT_EQ(std::vector<uint16_t>(shard.data(), shard.data() + 5), tokens);
  EXPECT_EQ(shard.vocab_size_hint(), 0);
}

TEST(TokenShard, WriteRoundTripsAndMatchesTheFormatByteForByte) {
  TempDir dir;
  std::vector<uint16_t> tokens(3001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 50257);
  const std::string path = dir.file("train_000000.bin");
  write_token_shard(path, tokens, 50257);
  EXPECT_EQ(read_bytes(path), raw_shard(20240520, 1, 3001, 50257, tokens));
  TokenShard shard(path);
  EXPECT_EQ(shard.size(), 3001);
  EXPECT_EQ(shard.vocab_size_hint(), 50257);
  EXPECT_EQ(std::memcmp(shard.data(), tokens.data(), tokens.size() * 2), 0);
  // Nothing but the shard: the temporary file was renamed into place.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(TokenShard, WriteReplacesAnExistingShard) {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  write_token_shard(path, std::vector<uint16_t>{1, 2, 3, 4}, 10);
  write_token_shard(path, std::vector<uint16_t>{9, 8}, 12);
  TokenShard shard(path);
  ASSERT_EQ(shard.size(), 2);
  EXPECT_EQ(shard.data()[0], 9);
  EXPECT_EQ(shard.data()[1], 8);
  EXPECT_EQ(shard.vocab_size_hint(), 12);
}

TEST(TokenShard, MovedShardKeepsItsMapping) {
  TempDir dir;
  write_token_shard(dir.file("s.bin"), std::vector<uint16_t>{4, 5, 6}, 0);
  std::vector<TokenShard> shards;
  shards.emplace_back(dir.file("s.bin"));
  shards.emplace_back(dir.file("s.bin"));  // reallocation moves the first
  EXPECT_EQ(shards[0].data()[2], 6);
  EXPECT_EQ(shards[1].size(), 3);
}

TEST(TokenShard, RejectsAFileTooShortForTheHeader) {
  TempDir dir;
  write_bytes(dir.file("short.bin"), std::string(100, '\0'));
  EXPECT_THAT(error_of(dir.file("short.bin")),
              AllOf(HasSubstr(dir.file("short.bin")), HasSubstr("is not a token shard"),
                    HasSubstr("too short")));
}

TEST(TokenShard, RejectsABadMagic) {
  TempDir dir;
  write_bytes(dir.file("m.bin"), raw_shard(12345, 1, 2, 0, {1, 2}));
  EXPECT_THAT(error_of(dir.file("m.bin")),
              AllOf(HasSubstr(dir.file("m.bin")),
                    HasSubstr("is not a token shard: magic 12345, expected 20240520"),
                    HasSubstr("llm.c/nanoGPT .bin format")));
}

TEST(TokenShard, RejectsAnUnsupportedVersion) {
  TempDir dir;
  write_bytes(dir.file("v.bin"), raw_shard(20240520, 2, 2, 0, {1, 2}));
  EXPECT_THAT(error_of(dir.file("v.bin")),
              AllOf(HasSubstr(dir.file("v.bin")), HasSubstr("unsupported token shard version 2")));
}

TEST(TokenShard, RejectsATruncatedShard) {
  TempDir dir;
  write_bytes(dir.file("t.bin"), raw_shard(20240520, 1, 10, 0, {1, 2, 3}));
  EXPECT_THAT(error_of(dir.file("t.bin")),
              AllOf(HasSubstr(dir.file("t.bin")),
                    HasSubstr("truncated: header says 10 tokens, file holds 3")));
  // Trailing garbage is as wrong as missing tokens.
  write_bytes(dir.file("long.bin"), raw_shard(20240520, 1, 2, 0, {1, 2, 3, 4}));
  EXPECT_THAT(error_of(dir.file("long.bin")), HasSubstr("header says 2 tokens, file holds 4"));
}

TEST(TokenShard, RejectsZeroTokens) {
  TempDir dir;
  write_bytes(dir.file("z.bin"), raw_shard(20240520, 1, 0, 0, {}));
  EXPECT_THAT(error_of(dir.file("z.bin")),
              AllOf(HasSubstr(dir.file("z.bin")), HasSubstr("no tokens")));
}

TEST(TokenShard, RejectsAMissingFile) {
  TempDir dir;
  EXPECT_THAT(error_of(dir.file("nope.bin")),
              AllOf(HasSubstr(dir.file("nope.bin")), HasSubstr("cannot open")));
}

TEST(TokenShard, WriteErrorsNameThePathAndLeaveNothingBehind) {
  TempDir dir;
  const std::string missing_dir = dir.file("no/such/dir/s.bin");
  try {
    write_token_shard(missing_dir, std::vector<uint16_t>{1}, 0);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing_dir));
  }
  EXPECT_THROW(write_token_shard(dir.file("empty.bin"), std::vector<uint16_t>{}, 0), UserError);
  EXPECT_THROW(write_token_shard(dir.file("big.bin"), std::vector<uint16_t>{1}, 70000), UserError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace strata::data
