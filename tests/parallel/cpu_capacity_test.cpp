// The prediction of the largest GPT-2 per placement on a machine without a GPU
// (parallel/cpu_capacity.h, Note [CPU placement model]): every term of one family member worked
// out by hand, and the search for the largest member against those terms.
#include "parallel/cpu_capacity.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace strata::parallel {
namespace {

// The default family: hidden 2048, 16 heads, vocabulary 256, sequence 128, micro-batch 1.
// Two blocks: Ψ = 2·(12·2048² + 13·2048) + (256 + 128)·2048 + 2·2048 = 101,507,072; every
// parameter is a multiple of 16 elements, so no unit is padded. A block is 50,358,272 elements.
constexpr double kPsi2 = 101'507'072;
constexpr double kBlock = 50'358'272;
// 4 B x 128 tokens x (2 blocks x (16·2048 + 2·16·128) + 2 x 256 logits values).
constexpr double kAct2 = 4.0 * 128 * (2 * (16 * 2048 + 2 * 16 * 128) + 2 * 256);
constexpr double kOpWm = 4.0 * 2 * 2048 * 4 * 2048;  // the hd x 4hd weight and its gradient

TEST(CpuCapacity, InMemoryTermsOfTwoBlocks) {
  const CpuRunBytes b = cpu_run_bytes(CpuPlacement::InMemory, CpuFamily{}, 2);
  EXPECT_EQ(b.params, 101'507'072);
  EXPECT_DOUBLE_EQ(b.host_states, 16 * kPsi2);  // fp32 parameters, gradients, m, v
  EXPECT_DOUBLE_EQ(b.activations, kAct2);
  EXPECT_DOUBLE_EQ(b.activations, 38'010'880);
  EXPECT_DOUBLE_EQ(b.operator_working, kOpWm);
  EXPECT_DOUBLE_EQ(b.unit_buffers, 0);  // stage 0 gathers nothing
  EXPECT_DOUBLE_EQ(b.offload_buffers, 0);
  EXPECT_DOUBLE_EQ(b.nvme, 0);
  EXPECT_DOUBLE_EQ(b.host(), 1'796'341'760);
}

TEST(CpuCapacity, ZeroInfCpuAddsThreeGatheredUnits) {
  const CpuRunBytes b = cpu_run_bytes(CpuPlacement::ZeroInfCpu, CpuFamily{}, 2);
  EXPECT_DOUBLE_EQ(b.host_states, 16 * kPsi2);  // parameters pinned, the rest on the host
  EXPECT_DOUBLE_EQ(b.unit_buffers, 4 * 3 * kBlock);
  EXPECT_DOUBLE_EQ(b.host(), 16 * kPsi2 + kAct2 + kOpWm + 4 * 3 * kBlock);
  EXPECT_DOUBLE_EQ(b.nvme, 0);
}

TEST(CpuCapacity, ZeroInfNvmeKeepsOnlyBuffersOnTheHost) {
  const CpuRunBytes b = cpu_run_bytes(CpuPlacement::ZeroInfNvme, CpuFamily{}, 2);
  EXPECT_DOUBLE_EQ(b.host_states, 0);  // the gradients are on NVMe too
  // Parameters (4), the optimizer's master, m and v (12) and the gradients (4) on NVMe, each
  // unit's extent in whole MiB: the embeddings (786,432 elements: 3 + 9 + 3 MiB), two blocks
  // (192.1 -> 193, 576.3 -> 577 and 193 MiB each) and the final norm (4,096 elements: 1 + 1 + 1
  // MiB).
  constexpr double kMiB = 1048576;
  EXPECT_DOUBLE_EQ(b.nvme, (3 + 9 + 3 + 2 * (193 + 577 + 193) + 1 + 1 + 1) * kMiB);
  EXPECT_GT(b.nvme, 20 * kPsi2);
  // 5 parameter buffers + 1 partition being loaded, 4 sub-group buffers of 12 bytes per
  // element, 4 gradient buffers, 3 transient gradient partitions, each of one block.
  EXPECT_DOUBLE_EQ(b.offload_buffers, 4 * kBlock * (6 + 12 + 4 + 3));
  EXPECT_DOUBLE_EQ(b.offload_buffers, 5'035'827'200);
  EXPECT_DOUBLE_EQ(b.start, 0);
  EXPECT_DOUBLE_EQ(b.host(), kAct2 + kOpWm + 4 * 3 * kBlock + 5'035'827'200);
}

// The model is built unit by unit into its partitions, so no term grows with the model but the
// activations: 40 blocks need the host bytes of 2 blocks plus 38 blocks' activations.
TEST(CpuCapacity, ZeroInfNvmeHostBytesDoNotGrowWithTheModel) {
  const CpuRunBytes small = cpu_run_bytes(CpuPlacement::ZeroInfNvme, CpuFamily{}, 2);
  const CpuRunBytes big = cpu_run_bytes(CpuPlacement::ZeroInfNvme, CpuFamily{}, 40);
  EXPECT_DOUBLE_EQ(big.start, 0);
  EXPECT_GT(big.params, 19 * small.params);
  EXPECT_DOUBLE_EQ(big.host() - big.activations, small.host() - small.activations);
}

TEST(CpuCapacity, LargestMemberIsTheLastThatFits) {
  constexpr double kGiB = 1073741824.0;
  const CpuFamily f;
  const CpuPrediction mem = largest_cpu_model(CpuPlacement::InMemory, f, 8 * kGiB, 0);
  EXPECT_EQ(mem.layers, 10);
  EXPECT_LE(cpu_run_bytes(CpuPlacement::InMemory, f, 10).host(), 8 * kGiB);
  EXPECT_GT(cpu_run_bytes(CpuPlacement::InMemory, f, 11).host(), 8 * kGiB);
  EXPECT_EQ(mem.limit, "host memory");
  EXPECT_EQ(mem.at.layers, 10);

  // Bound by the disk: 20Ψ on NVMe within 5.4 GiB.
  const CpuPrediction nvme = largest_cpu_model(CpuPlacement::ZeroInfNvme, f, 8 * kGiB, 5.4 * kGiB);
  EXPECT_EQ(nvme.limit, "NVMe");
  EXPECT_LE(nvme.at.nvme, 5.4 * kGiB);
  EXPECT_GT(cpu_run_bytes(CpuPlacement::ZeroInfNvme, f, nvme.layers + 1).nvme, 5.4 * kGiB);
  EXPECT_EQ(nvme.layers, 5);

  // Nothing fits: one block's states alone are 0.8 GB.
  const CpuPrediction none = largest_cpu_model(CpuPlacement::InMemory, f, 0.5 * kGiB, 0);
  EXPECT_EQ(none.layers, 0);
  EXPECT_EQ(none.limit, "host memory");

  const CpuPrediction capped = largest_cpu_model(CpuPlacement::InMemory, f, 1e15, 0, 5);
  EXPECT_EQ(capped.layers, 5);
  EXPECT_EQ(capped.limit, "--max-layers");
}

TEST(CpuCapacity, RefusesWhatDoesNotExist) {
  EXPECT_THROW(cpu_run_bytes(CpuPlacement::ZeroOffload, CpuFamily{}, 2), UserError);
  CpuFamily odd;
  odd.heads = 3;
  EXPECT_THROW(cpu_run_bytes(CpuPlacement::InMemory, odd, 2), UserError);
  EXPECT_THROW(cpu_run_bytes(CpuPlacement::InMemory, CpuFamily{}, 0), UserError);
  EXPECT_FALSE(cpu_placement_exists(CpuPlacement::ZeroOffload));
}

}  // namespace
}  // namespace strata::parallel
