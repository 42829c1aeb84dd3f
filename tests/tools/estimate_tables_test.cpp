// Runs `estimate --table infinity-memory | strategies | offload-models` and holds every printed
// entry to the papers' values (docs/tables.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"
#include "tests/support/tool_test_util.h"

namespace strata::tools {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;

CommandResult estimate(std::vector<std::string> args) {
  args.insert(args.begin(), std::string(STRATA_BINARY_DIR) + "/estimate");
  return testing::run_command(args, std::chrono::seconds(60));
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Rows whose first word is `first`, split into words.
std::map<std::string, std::vector<std::string>> rows_by_first_word(const std::string& out) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> w = words(line);
    if (!w.empty()) rows.emplace(w[0], w);
  }
  return rows;
}

// Figure 2a of ZeRO-Infinity (arXiv:2104.07857) as printed: params (T), layers, hidden, heads,
// model states (TB/model), act. and act. ckpt. (TB/node), working memory per GPU for model
// states and activations (GB).
const char* const kPaperFigure2a[5][9] = {
    {"0.10", "80", "10K", "128", "1.83", "2.03", "0.05", "1.95", "1.63"},
    {"0.50", "100", "20K", "160", "9.16", "3.91", "0.12", "6.25", "2.50"},
    {"1.01", "128", "25K", "256", "18.31", "7.13", "0.20", "9.77", "3.56"},
    {"10.05", "195", "64K", "512", "182.81", "24.38", "0.76", "64.00", "8.00"},
    {"101.47", "315", "160K", "1024", "1845.70", "88.59", "3.08", "400.00", "18.00"},
};

TEST(EstimateTables, InfinityMemoryPrintsThePapersFigure2a) {
  const CommandResult r = estimate({"--table", "infinity-memory"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = rows_by_first_word(r.out);
  for (const auto& paper : kPaperFigure2a) {
    auto it = rows.find(paper[0]);
    ASSERT_NE(it, rows.end()) << "no row for " << paper[0] << "T\n" << r.out;
    ASSERT_EQ(it->second.size(), 9u) << r.out;
    for (size_t c = 0; c < 9; ++c) {
      // The one entry the paper's own formula does not give (Note [ZeRO-Infinity memory
      // model]): the 0.10T model-state working memory is 4·hd·4hd = 1.5625 GB, printed 1.95.
      const std::string expected = std::string(paper[0]) == "0.10" && c == 7 ? "1.56" : paper[c];
      EXPECT_EQ(it->second[c], expected) << paper[0] << "T, column " << c << "\n" << r.out;
    }
  }
  // The tool names the difference itself.
  EXPECT_THAT(r.out, HasSubstr("differ from the paper's printed values: 1"));
  EXPECT_THAT(r.out, HasSubstr("0.10T row, model-state working memory: 1.56 here, 1.95 in the "
                               "paper"));
}

TEST(EstimateTables, StrategiesOnTheDgx2AndThePapersClaims) {
  const CommandResult r = estimate({"--table", "strategies"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One node of 16 x 32 GiB, 1.5 TiB CPU, 28 TiB NVMe (Note [Placement capacities]).
  EXPECT_THAT(r.out, HasSubstr("1 node x 16 GPUs (N = 16), 32.00 GiB per GPU; 1.50 TiB CPU "
                               "memory and 28.00 TiB NVMe per node"));
  const std::vector<std::pair<std::string, std::string>> largest = {
      {"Data parallel", "1.72B"},   {"ZeRO-2", "11.00B"}, {"ZeRO-Offload", "17.18B"},
      {"3D parallelism", "27.49B"}, {"ZeRO-3", "27.49B"}, {"ZeRO-Inf-CPU", "82.46B"},
      {"ZeRO-Inf-NVMe", "1.54T"}};
  std::istringstream in(r.out);
  std::map<std::string, std::string> line_of;
  for (std::string line; std::getline(in, line);)
    for (const auto& [name, value] : largest)
      if (line.rfind("  " + name + " ", 0) == 0 && line_of.count(name) == 0) line_of[name] = line;
  for (const auto& [name, value] : largest) {
    ASSERT_EQ(line_of.count(name), 1u) << name << "\n" << r.out;
    EXPECT_THAT(line_of[name], HasSubstr(" " + value + " ")) << r.out;
  }
  // The claims: 1T on one node, 13B on one V100, 32T on 32 nodes, ~50x 3D parallelism.
  EXPECT_THAT(r.out, HasSubstr("ZeRO-Inf-NVMe, 1 node"));
  EXPECT_THAT(r.out, HasSubstr("13B      17.18B  1.32"));
  EXPECT_THAT(r.out, HasSubstr("32T      49.26T  1.54"));
  EXPECT_THAT(r.out, HasSubstr("~50x         56x  1.12"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("the claim exceeds")));
}

TEST(EstimateTables, StrategiesOnADescribedCluster) {
  // 2 nodes x 8 x 80 GB, 1 TB CPU and 2 TB NVMe per node: 3D/ZeRO-3 16 x 80e9 / 20 = 64B;
  // ZeRO-Offload min(80e9 / 2, 2 x 1e12 / 18) = 40B; Inf-NVMe 2 x 2e12 / 20 = 200B.
  const CommandResult r = estimate({"--table", "strategies", "--nodes", "2", "--gpus-per-node", "8",
                                    "--gpu-mem", "80GB", "--cpu-mem", "1TB", "--nvme", "2TB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 nodes x 8 GPUs (N = 16)"));
  EXPECT_THAT(r.out, HasSubstr("64.00B  GPU memory"));
  EXPECT_THAT(r.out, HasSubstr("40.00B  GPU memory"));
  EXPECT_THAT(r.out, HasSubstr("200.00B  NVMe"));
  EXPECT_THAT(r.out, HasSubstr("100.00B  CPU memory"));  // Inf-CPU: 2 x 1e12 / 20
}

TEST(EstimateTables, OffloadModelsOnTheV100AndASmallHost) {
  CommandResult r = estimate({"--table", "offload-models"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto rows = rows_by_first_word(r.out);
  // model layers hidden batch MP params GPU-params ckpt act total host fits min-MP
  const char* const kShapes[14][5] = {
      {"1B", "20", "2048", "32", "1"}, {"2B", "40", "2048", "32", "1"},
      {"4B", "64", "2304", "32", "1"}, {"6B", "53", "3072", "16", "1"},
      {"8B", "72", "3072", "16", "1"}, {"10B", "50", "4096", "10", "1"},
      {"11B", "55", "4096", "8", "1"}, {"12B", "60", "4096", "4", "1"},
      {"13B", "65", "4096", "4", "1"}, {"15B", "78", "4096", "8", "2"},
      {"20B", "25", "8192", "8", "2"}, {"40B", "50", "8192", "8", "2"},
      {"60B", "75", "8192", "8", "2"}, {"70B", "69", "9216", "8", "8"}};
  for (const auto& shape : kShapes) {
    ASSERT_EQ(rows.count(shape[0]), 1u) << shape[0] << "\n" << r.out;
    const std::vector<std::string>& w = rows[shape[0]];
    ASSERT_EQ(w.size(), 13u) << r.out;
    for (size_t c = 0; c < 5; ++c) EXPECT_EQ(w[c], shape[c]) << shape[0];
    const bool paper_mp_fits = std::string(shape[0]) != "40B" && std::string(shape[0]) != "60B";
    EXPECT_EQ(w[11], paper_mp_fits ? "yes" : "no") << shape[0];
  }
  EXPECT_EQ(rows["13B"][5], "13.30B");
  EXPECT_EQ(rows["13B"][9], "27.8");  // GiB per GPU, under 32
  EXPECT_EQ(rows["70B"][10], "1187.0");
  EXPECT_EQ(rows["40B"][12], "4");
  EXPECT_EQ(rows["60B"][12], "8");

  // This machine's kind: 24 GB of host memory holds only the 1B model's 18Ψ.
  r = estimate({"--table", "offload-models", "--cpu-mem", "24GB", "--gpus-per-node", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rows = rows_by_first_word(r.out);
  EXPECT_EQ(rows["1B"][11], "yes");
  EXPECT_EQ(rows["2B"][11], "no");
  EXPECT_EQ(rows["70B"][12], "none");
}

TEST(EstimateTables, HardwareMeasuresEachTierQuickly) {
  testing::TempDir dir;
  const CommandResult r =
      estimate({"--hardware", "--nvme-dir", dir.path().string(), "--probe-mib", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The table row: nodes, GPUs, GPU mem, CPU mem, NVMe, GPU mem bw, triad, NVMe read, write.
  std::vector<std::string> row;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> w = words(line);
    if (w.size() == 9 && w[0] == "1") row = w;
  }
  ASSERT_EQ(row.size(), 9u) << r.out;
  EXPECT_GT(std::stod(row[3]), 0) << "CPU memory\n" << r.out;
  EXPECT_GT(std::stod(row[4]), 0) << "NVMe size\n" << r.out;
  for (size_t c = 6; c < 9; ++c) EXPECT_GT(std::stod(row[c]), 0) << "column " << c << r.out;
  EXPECT_THAT(r.out, HasSubstr("8 MiB through the NVMe store"));
  if (row[1] == "0") {
    EXPECT_THAT(r.out, HasSubstr("GPU: no GPU"));
    EXPECT_EQ(row[5], "-");
  } else {
    EXPECT_THAT(r.out, HasSubstr("host-to-device"));
  }
  // The store removed its file.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Note [CPU placement model]: the prediction for a machine without a GPU, rows and the terms of
// each row's model (tests/parallel/cpu_capacity_test.cpp holds the terms themselves).
TEST(EstimateTables, StrategiesOnThisMachineWithoutAGpu) {
  const CommandResult r = estimate(
      {"--table", "strategies", "--device", "cpu", "--cpu-mem", "8GiB", "--nvme", "5.4GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("family: GPT-2, hidden 2048, 16 heads, vocabulary 256, sequence "
                               "128 (= n_positions), micro-batch 1"));
  EXPECT_THAT(r.out, HasSubstr("host memory 8.00 GiB (--cpu-mem 8GiB), NVMe 5.40 GiB"));
  // The first row of each placement: its name in 16 columns, then the words after it.
  auto placement_rows = [](const std::string& out) {
    std::map<std::string, std::vector<std::string>> rows;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.size() > 18 && line.rfind("  ", 0) == 0) {
        std::string name = line.substr(2, 16);
        name.erase(name.find_last_not_of(' ') + 1);
        if (rows.count(name) == 0) rows.emplace(name, words(line.substr(18)));
      }
    return rows;
  };
  auto rows = placement_rows(r.out);
  // layers, parameters, host GiB, NVMe GiB, limit.
  ASSERT_EQ(rows.count("in memory"), 1u) << r.out;
  EXPECT_EQ(rows["in memory"][0], "10");
  EXPECT_EQ(rows["in memory"][1], "504.37M");
  EXPECT_EQ(rows["in memory"][2], "7.82");
  EXPECT_EQ(rows["in memory"][4], "host");
  EXPECT_EQ(rows["ZeRO-Inf-CPU"][0], "9");
  EXPECT_EQ(rows["ZeRO-Inf-CPU"][1], "454.01M");
  // 20 bytes per parameter on NVMe: the gradients too (Note [Gradients on the NVMe tier]).
  EXPECT_EQ(rows["ZeRO-Inf-NVMe"][0], "5");
  EXPECT_EQ(rows["ZeRO-Inf-NVMe"][1], "252.58M");
  EXPECT_EQ(rows["ZeRO-Inf-NVMe"][4], "NVMe");
  EXPECT_EQ(rows["ZeRO-Offload"][0], "-");
  EXPECT_THAT(r.out, HasSubstr("no GPU: run.device cpu has no device memory to offload from"));
  // A smaller family through the flags: hidden 64 is 49,984 parameters a block.
  const CommandResult small =
      estimate({"--table", "strategies", "--device", "cpu", "--cpu-mem", "1GiB", "--nvme", "0",
                "--hidden", "64", "--heads", "4", "--seq", "32", "--max-layers", "3"});
  ASSERT_EQ(small.exit_code, 0) << small.err;
  auto small_rows = placement_rows(small.out);
  EXPECT_EQ(small_rows["in memory"][0], "3");
  EXPECT_EQ(small_rows["in memory"][1], "0.17M");
  EXPECT_EQ(small_rows["in memory"][4], "--max-layers");
  EXPECT_EQ(small_rows["ZeRO-Inf-NVMe"][0], "0");  // no disk: not one block fits
  EXPECT_EQ(small_rows["ZeRO-Inf-NVMe"][4], "NVMe");
}

TEST(EstimateTables, BadInputExitsOneWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--table", "infinity"}, "infinity-memory"},
      {{"--table", "strategies", "--nodes", "0"}, "--nodes '0' is not a count"},
      {{"--table", "strategies", "--nodes", "99999999999999999999"}, "--nodes '9999"},
      {{"--table", "strategies", "--nodes", "9000000000000000000"}, "1 to 1,000,000 nodes"},
      {{"--table", "strategies", "--gpus-per-node", "two"}, "--gpus-per-node 'two'"},
      {{"--table", "strategies", "--gpu-mem", "lots"}, "--gpu-mem 'lots' is not a size"},
      {{"--table", "offload-models", "--cpu-mem", "-1TB"}, "--cpu-mem '-1TB' is not a size"},
      {{"--table", "strategies", "--nvme", "28XB"}, "--nvme '28XB'"},
      {{"--table", "infinity-memory", "--nodes", "2"}, "has no cluster"},
      {{"--model", "gpt2", "--gpu-mem", "32GiB"}, "describe a cluster"},
      {{"--table", "strategies", "--params", "1e9"}, "takes no --model or --params"},
      {{"--hardware", "--nvme-dir", "/nonexistent/dir"}, "--nvme-dir '/nonexistent/dir'"},
      {{"--hardware", "--probe-mib", "0"}, "--probe-mib 0"},
      {{"--hardware", "--table", "zero"}, "--hardware measures this machine"},
      {{"--table", "strategies", "--device", "tpu"}, "--device 'tpu'"},
      {{"--table", "zero", "--device", "cpu"}, "--table strategies only"},
      {{"--table", "strategies", "--device", "cpu", "--gpu-mem", "32GiB"}, "--device cpu is one"},
      {{"--table", "strategies", "--device", "cpu", "--heads", "3"}, "not divisible by --heads"},
      {{"--table", "strategies", "--device", "cpu", "--nvme-dir", "/nonexistent/dir"},
       "--nvme-dir '/nonexistent/dir'"},
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
