// Runs the `estimate` binary: Table 1 of the ZeRO paper, per-category bytes for a model or a
// parameter count, and the errors of bad input (docs/zero.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/support/tool_test_util.h"

namespace strata::tools {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;

CommandResult estimate(std::vector<std::string> args) {
  args.insert(args.begin(), std::string(STRATA_BINARY_DIR) + "/estimate");
  return testing::run_command(args, std::chrono::seconds(60));
}

// Table 1 of Rajbhandari et al. 2019 (arXiv:1910.02054) as printed, GB: rows Nd = 1 ... 1024;
// per model (7.5B, 128B, 1T) the columns Pos, Pos+g, Pos+g+p. The reference, not computed.
const char* const kPaperTable1[6][9] = {
    {"120", "120", "120", "2048", "2048", "2048", "16000", "16000", "16000"},
    {"52.5", "41.3", "30", "896", "704", "512", "7000", "5500", "4000"},
    {"35.6", "21.6", "7.5", "608", "368", "128", "4750", "2875", "1000"},
    {"31.4", "16.6", "1.88", "536", "284", "32", "4187", "2218", "250"},
    {"30.4", "15.4", "0.47", "518", "263", "8", "4046", "2054", "62.5"},
    {"30.1", "15.1", "0.12", "513", "257", "2", "4011", "2013", "15.6"},
};
const char* const kDpDegrees[6] = {"1", "4", "16", "64", "256", "1024"};

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(Estimate, TableZeroPrintsEveryEntryOfThePaper) {
  const CommandResult r = estimate({"--table", "zero"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A table row is the DP degree followed by nine values.
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> w = words(line);
    if (w.size() == 10 && w[0].find_first_not_of("0123456789") == std::string::npos)
      rows.push_back(w);
  }
  ASSERT_EQ(rows.size(), 6u) << r.out;
  for (size_t row = 0; row < 6; ++row) {
    EXPECT_EQ(rows[row][0], kDpDegrees[row]);
    for (size_t col = 0; col < 9; ++col)
      EXPECT_EQ(rows[row][col + 1], kPaperTable1[row][col])
          << "Nd = " << kDpDegrees[row] << ", column " << col << "\n"
          << r.out;
  }
  EXPECT_THAT(r.out, HasSubstr("7.5B Model (GB)"));
  EXPECT_THAT(r.out, HasSubstr("2Ψ + 14Ψ/Nd"));
}

TEST(Estimate, ModelPrintsBytesPerCategoryAndTheFormula) {
  // GPT-2 124M: Ψ = 124,475,904 (wte padded to 50304 rows); fp32, stage 2, Nd = 8:
  // params 4Ψ, grads 4Ψ/8, optimizer 8Ψ/8. Every unit of GPT-2 is a multiple of 8*16 elements,
  // so the engine's padded bytes equal the formula's.
  const CommandResult r =
      estimate({"--model", "gpt2", "--dp", "8", "--stage", "2", "--precision", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("124,475,904 parameters"));
  EXPECT_THAT(r.out, HasSubstr("4Ψ + 12Ψ/Nd"));
  EXPECT_THAT(r.out, HasSubstr("497,903,616"));  // params
  EXPECT_THAT(r.out, HasSubstr("62,237,952"));   // grads
  EXPECT_THAT(r.out, HasSubstr("124,475,904"));  // optimizer (m, v)
  EXPECT_THAT(r.out, HasSubstr("684,617,472"));  // total
  EXPECT_THAT(r.out, HasSubstr("bytes (engine)"));
  EXPECT_THAT(r.out, HasSubstr("GiB"));
  EXPECT_THAT(r.out, Not(HasSubstr("ZeRO stage 1")));  // only the stage asked for
}

TEST(Estimate, ConfigFileNamesOfGpt2AreAccepted) {
  const CommandResult r = estimate({"--model", "gpt2-124m", "--dp", "2", "--stage", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("model: gpt2 (gpt2-124m)"));
  EXPECT_THAT(r.out, HasSubstr("4Ψ + 12Ψ/Nd"));
}

TEST(Estimate, ParamsWithAllStagesGivesThePapersFigure1) {
  // Ψ = 7.5B, Nd = 64, mixed precision Adam: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
  const CommandResult r = estimate({"--params", "7.5e9", "--dp", "64", "--stage", "all"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* total : {"120,000,000,000", "31,406,250,000", "16,640,625,000", "1,875,000,000"})
    EXPECT_THAT(r.out, HasSubstr(total));
  for (const char* stage : {"ZeRO stage 0", "ZeRO stage 1", "ZeRO stage 2", "ZeRO stage 3"})
    EXPECT_THAT(r.out, HasSubstr(stage));
  // No units without a model, so no engine column.
  EXPECT_THAT(r.out, Not(HasSubstr("bytes (engine)")));
}

TEST(Estimate, BadInputExitsOneWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "gpt2-mediun", "--dp", "2"}, "did you mean 'gpt2-medium'"},
      {{"--model", "nonsense-model"}, "unknown model 'nonsense-model'"},
      {{"--model", "gpt2", "--dp", "0"}, "--dp 0: the data parallel degree"},
      {{"--model", "gpt2", "--dp", "-4"}, "--dp -4"},
      {{"--model", "gpt2", "--stage", "4"}, "--stage '4' is not a ZeRO stage"},
      {{"--model", "gpt2", "--params", "1e9"}, "both were given"},
      {{"--dp", "8"}, "exactly one of --model"},
      {{"--params", "lots"}, "not a parameter count"},
      {{"--params", "-5"}, "not a parameter count"},
      {{"--params", "1e9", "--precision", "fp8"}, "unknown precision 'fp8'"},
      {{"--params", "1e9", "--optimizer", "lion"}, "unknown optimizer 'lion'"},
      {{"--table", "megatron"}, "--table 'megatron' is not a known table"},
      {{"--table", "zero", "--model", "gpt2"}, "takes no --model"},
      {{"--dp", "eight", "--model", "gpt2"}, "--dp"},  // CLI11's own parse error
  };
  for (const Case& c : cases) {
    const CommandResult r = estimate(c.args);
    std::string joined;
    for (const std::string& a : c.args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 1) << joined << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << joined;
  }
}

}  // namespace
}  // namespace strata::tools
