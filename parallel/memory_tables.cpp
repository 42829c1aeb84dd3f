#include "parallel/memory_tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "core/error.h"
#include "models/gpt2/config.h"

namespace strata::parallel {

std::vector<TransformerShape> infinity_table_shapes() {
  constexpr int64_t K = 1024;
  return {{80, 10 * K, 128},
          {100, 20 * K, 160},
          {128, 25 * K, 256},
          {195, 64 * K, 512},
          {315, 160 * K, 1024}};
}

InfinityMemoryRow infinity_memory_row(const TransformerShape& s) {
  STRATA_USER_CHECK(s.layers > 0 && s.hidden > 0 && s.heads > 0,
                    "a transformer needs layers, hidden size and heads above 0 (got {}, {}, {})",
                    s.layers, s.hidden, s.heads);
  // Note [ZeRO-Infinity memory model]. Doubles: 101T parameters x 20 bytes and the
  // activation terms stay exact far below 2^53.
  const double nl = static_cast<double>(s.layers), hd = static_cast<double>(s.hidden);
  const double heads = static_cast<double>(s.heads), seq = static_cast<double>(kInfinitySeq);
  const double ci = static_cast<double>(kInfinityCheckpointInterval);
  const double node_batch = static_cast<double>(kInfinityBatchPerNode);
  const double gpu_batch = node_batch / static_cast<double>(kInfinityGpusPerNode);
  constexpr double kFp16 = 2;
  const double per_token_block = 16 * hd + 2 * heads * seq;  // fp16 values a block keeps
  InfinityMemoryRow r;
  r.shape = s;
  r.params = 12 * nl * hd * hd;
  r.model_states_bytes = kInfinityBytesPerParam * r.params;
  r.activations_bytes = kFp16 * node_batch * seq * nl * per_token_block;
  r.checkpoints_bytes = kFp16 * node_batch * seq * hd * nl / ci;
  r.model_state_wm_bytes = 4 * hd * 4 * hd;
  r.activation_wm_bytes = kFp16 * gpu_batch * seq * ci * per_token_block;
  return r;
}

std::string format_two_decimals(double value) {
  STRATA_CHECK(std::isfinite(value) && value >= 0, "value {}", value);
  // The epsilon keeps an exact decimal half (1.625, 24.375) from falling below it.
  const double rounded = std::floor(value * 100 + 0.5 + 1e-9) / 100;
  return fmt::format("{:.2f}", rounded);
}

void validate(const ClusterSpec& c) {
  if (c.nodes < 1 || c.nodes > 1'000'000)
    user_error("--nodes {}: give a cluster of 1 to 1,000,000 nodes", c.nodes);
  if (c.gpus_per_node > 100'000)
    user_error("--gpus-per-node {}: give at most 100,000 GPUs per node", c.gpus_per_node);
  if (c.gpus_per_node < 1)
    user_error("--gpus-per-node {}: use 1 or more (placements that need no GPU do not exist here)",
               c.gpus_per_node);
  if (!(c.gpu_bytes > 0)) user_error("--gpu-mem must be a positive size such as 32GiB");
  if (!(c.cpu_bytes >= 0)) user_error("--cpu-mem must be a size such as 1.5TiB");
  if (!(c.nvme_bytes >= 0)) user_error("--nvme must be a size such as 28TiB (0 for none)");
}

std::string placement_name(Placement p) {
  switch (p) {
    case Placement::DataParallel:
      return "Data parallel";
    case Placement::Zero2:
      return "ZeRO-2";
    case Placement::ZeroOffload:
      return "ZeRO-Offload";
    case Placement::ThreeD:
      return "3D parallelism";
    case Placement::Zero3:
      return "ZeRO-3";
    case Placement::ZeroInfCpu:
      return "ZeRO-Inf-CPU";
    case Placement::ZeroInfNvme:
      return "ZeRO-Inf-NVMe";
  }
  STRATA_UNREACHABLE();
}

std::string placement_params(Placement p) {
  switch (p) {
    case Placement::DataParallel:
    case Placement::Zero2:
    case Placement::ZeroOffload:
      return "GPU, whole";
    case Placement::ThreeD:
    case Placement::Zero3:
      return "GPU, partitioned";
    case Placement::ZeroInfCpu:
      return "CPU, partitioned";
    case Placement::ZeroInfNvme:
      return "NVMe, partitioned";
  }
  STRATA_UNREACHABLE();
}

std::string placement_states(Placement p) {
  switch (p) {
    case Placement::DataParallel:
      return "GPU, whole";
    case Placement::Zero2:
    case Placement::ThreeD:
    case Placement::Zero3:
      return "GPU, partitioned";
    case Placement::ZeroOffload:
    case Placement::ZeroInfCpu:
      return "CPU, partitioned";
    case Placement::ZeroInfNvme:
      return "NVMe, partitioned";
  }
  STRATA_UNREACHABLE();
}

std::string placement_formula(Placement p) {
  switch (p) {
    case Placement::DataParallel:
      return "20Ψ ≤ M_gpu";
    case Placement::Zero2:
      return "2Ψ + 18Ψ/N ≤ M_gpu";
    case Placement::ZeroOffload:
      return "2Ψ ≤ M_gpu, 18Ψ/nodes ≤ M_cpu";
    case Placement::ThreeD:
    case Placement::Zero3:
      return "20Ψ/N ≤ M_gpu";
    case Placement::ZeroInfCpu:
      return "20Ψ ≤ nodes·M_cpu";
    case Placement::ZeroInfNvme:
      return "20Ψ ≤ nodes·M_nvme";
  }
  STRATA_UNREACHABLE();
}

PlacementCapacity placement_capacity(Placement p, const ClusterSpec& c) {
  validate(c);
  // Note [Placement capacities].
  const double n = static_cast<double>(c.gpus()), nodes = static_cast<double>(c.nodes);
  const double b = kInfinityBytesPerParam;  // 20 = 2 (fp16 parameters) + 18 (the rest)
  switch (p) {
    case Placement::DataParallel:
      return {c.gpu_bytes / b, "GPU memory"};
    case Placement::Zero2:
      return {c.gpu_bytes / (2 + 18 / n), "GPU memory"};
    case Placement::ZeroOffload: {
      const double gpu = c.gpu_bytes / 2, cpu = c.cpu_bytes * nodes / 18;
      return gpu <= cpu ? PlacementCapacity{gpu, "GPU memory"}
                        : PlacementCapacity{cpu, "CPU memory"};
    }
    case Placement::ThreeD:
    case Placement::Zero3:
      return {c.gpu_bytes * n / b, "GPU memory"};
    case Placement::ZeroInfCpu:
      return {c.cpu_bytes * nodes / b, "CPU memory"};
    case Placement::ZeroInfNvme:
      return {c.nvme_bytes * nodes / b, "NVMe"};
  }
  STRATA_UNREACHABLE();
}

std::vector<OffloadModel> offload_table_models() {
  // Table 3 of arXiv:2101.06840, one row per model.
  return {{"1B", 20, 2048, 32, 1}, {"2B", 40, 2048, 32, 1}, {"4B", 64, 2304, 32, 1},
          {"6B", 53, 3072, 16, 1}, {"8B", 72, 3072, 16, 1}, {"10B", 50, 4096, 10, 1},
          {"11B", 55, 4096, 8, 1}, {"12B", 60, 4096, 4, 1}, {"13B", 65, 4096, 4, 1},
          {"15B", 78, 4096, 8, 2}, {"20B", 25, 8192, 8, 2}, {"40B", 50, 8192, 8, 2},
          {"60B", 75, 8192, 8, 2}, {"70B", 69, 9216, 8, 8}};
}

OffloadModelMemory offload_model_memory(const OffloadModel& m, int64_t mp) {
  STRATA_USER_CHECK(mp >= 1, "a model-parallel degree is 1 or more, not {}", mp);
  models::gpt2::GPT2Config config;  // vocabulary 50257 padded to 50304, 1024 positions
  config.n_layer = m.layers;
  config.n_embd = m.hidden;
  config.n_head = m.hidden / kOffloadHeadDim;
  // Note [ZeRO-Offload model memory].
  const double hd = static_cast<double>(m.hidden), nl = static_cast<double>(m.layers);
  const double b = static_cast<double>(m.batch_per_gpu), seq = static_cast<double>(kOffloadSeq);
  const double heads = static_cast<double>(config.n_head), d = static_cast<double>(mp);
  OffloadModelMemory r;
  r.params = static_cast<double>(models::gpt2::num_parameters(config));
  r.gpu_params_bytes = 2 * r.params / d;
  r.gpu_checkpoints_bytes = 2 * b * seq * hd * nl;
  r.gpu_activation_wm_bytes = 2 * b * seq * (16 * hd + 2 * heads * seq) / d;
  r.host_bytes = 18 * r.params;
  return r;
}

bool offload_model_fits(const OffloadModel& m, int64_t mp, const ClusterSpec& c) {
  const OffloadModelMemory mem = offload_model_memory(m, mp);
  return mp <= c.gpus_per_node && mem.gpu_bytes() <= c.gpu_bytes && mem.host_bytes <= c.cpu_bytes;
}

int64_t smallest_fitting_mp(const OffloadModel& m, const ClusterSpec& c) {
  for (int64_t mp = 1; mp <= c.gpus_per_node; mp *= 2)
    if (offload_model_fits(m, mp, c)) return mp;
  return 0;
}

double parse_bytes(std::string_view text, std::string_view flag) {
  const std::string s(text);
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  struct Unit {
    const char* name;
    double bytes;
  };
  static constexpr Unit kUnits[] = {
      {"", kGiB},    {"b", 1},    {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", kGiB},
      {"tib", kTiB}, {"kb", 1e3}, {"mb", 1e6},     {"gb", 1e9},        {"tb", 1e12},
  };
  if (used > 0 && std::isfinite(value) && value >= 0)
    for (const Unit& u : kUnits)
      if (unit == u.name) return value * u.bytes;
  user_error(
      "{} '{}' is not a size; give a number with a unit such as 32GiB, 1.5TiB, 28TB or 512MB "
      "(a bare number is GiB)",
      flag, text);
}

}  // namespace strata::parallel
