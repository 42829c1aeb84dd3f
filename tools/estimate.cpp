// estimate: model-state memory per device under ZeRO-DP, before running anything (docs/zero.md).
//
//   estimate --model gpt2-medium --dp 8 --stage 2 [--precision mixed|fp32]
//            [--optimizer adamw|sgd|sgd-plain] [--tp 2]  # per tensor-parallel rank
//   estimate --params 7.5e9 --dp 64 --stage all
//   estimate --table zero             # Table 1 of the ZeRO paper, computed
//   estimate --table infinity-memory  # ZeRO-Infinity's Figure 2a (memory for massive models)
//   estimate --table strategies [--nodes N --gpus-per-node G --gpu-mem 32GiB --cpu-mem 1.5TiB
//                               --nvme 28TiB]   # the largest model per placement
//   estimate --table offload-models [cluster flags]  # ZeRO-Offload's GPT-2 models
//   estimate --table strategies --device cpu [--cpu-mem 10GiB --nvme 6GB --hidden 2048 --heads 16
//            --vocab 256 --seq 128 --micro-batch 1]  # this machine without a GPU, the largest
//                                                    # GPT-2 of the family per placement
//   estimate --hardware [--nvme-dir DIR] [--probe-mib N]  # this machine's tiers, measured
//
// Prints the bytes of parameters, gradients and optimizer states per device by the formula of
// the stage (Note [ZeRO memory model] in parallel/zero_memory.h) and, for a registry model, the
// exact bytes the engine allocates with its padding (Note [ZeRO padding]) — what `train`
// measures. The papers' other tables are computed by parallel/memory_tables.h and measured by
// offload/hardware_probe.h (docs/tables.md). Exit status: 0 done, 1 bad input.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "models/registry.h"
#include "parallel/cpu_capacity.h"
#include "parallel/memory_tables.h"
#include "parallel/zero_memory.h"
#include "tools/estimate/machine_tables.h"

namespace strata::tools {
namespace {

using parallel::ZeroMemoryConfig;

struct Args {
  std::string model;
  std::string params;  // a number such as 7.5e9, kept as text to report it as given
  int64_t dp = 1;
  int64_t tp = 1;
  std::string stage = "all";
  std::string precision = "mixed";
  std::string optimizer = "adamw";
  int64_t persistence_threshold = 100'000;
  std::string table;
  // The cluster of --table strategies / offload-models; empty: the paper's DGX-2.
  std::string nodes, gpus_per_node, gpu_mem, cpu_mem, nvme;
  bool hardware = false;
  // --table strategies --device cpu: this machine without a GPU (Note [CPU placement model]).
  std::string device = "gpu";
  parallel::CpuFamily family;
  int64_t max_layers = 4096;
  std::string nvme_dir = "/tmp";
  int64_t probe_mib = 256;
};

// The names configs/ uses for the GPT-2 sizes (gpt2-124m.yaml ...), as the registry knows them.
const std::map<std::string, std::string>& model_aliases() {
  static const std::map<std::string, std::string> aliases = {{"gpt2-124m", "gpt2"},
                                                             {"gpt2-350m", "gpt2-medium"},
                                                             {"gpt2-774m", "gpt2-large"},
                                                             {"gpt2-1558m", "gpt2-xl"}};
  return aliases;
}

std::string resolve_model(const std::string& name) {
  const models::ModelRegistry& registry = models::ModelRegistry::global();
  if (registry.contains(name)) return name;
  if (auto it = model_aliases().find(name); it != model_aliases().end()) return it->second;
  std::vector<std::string> candidates = registry.names();
  for (const auto& [alias, target] : model_aliases()) candidates.push_back(alias);
  const std::string near = config::nearest(name, candidates);
  user_error("--model: unknown model '{}'{}; known models: {}", name,
             near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
             fmt::join(registry.names(), ", "));
}

double parse_params(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(value >= 1) || !std::isfinite(value))
    user_error(
        "--params '{}' is not a parameter count; give a positive number such as 7.5e9 or "
        "350e6",
        text);
  return value;
}

std::vector<int> parse_stages(const std::string& text) {
  if (text == "all") return {0, 1, 2, 3};
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') return {text[0] - '0'};
  user_error(
      "--stage '{}' is not a ZeRO stage; use 0 (plain data parallel), 1 (optimizer states "
      "partitioned), 2 (+ gradients), 3 (+ parameters) or all",
      text);
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string gib(double bytes) {
  return fmt::format("{:.4f}", bytes / (1024.0 * 1024.0 * 1024.0));
}
std::string gb(double bytes) {
  return fmt::format("{:.4f}", bytes / 1e9);
}

void print_table_zero() {
  using T = parallel::ZeroTable1;
  const T t = parallel::zero_table1();
  fmt::print(
      "Table 1 of ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054): per-device model-state "
      "memory in GB (1e9 bytes)\n"
      "as a function of the DP degree Nd; mixed precision Adam, K = 12: Pos = 4Ψ + 12Ψ/Nd, "
      "Pos+g = 2Ψ + 14Ψ/Nd, Pos+g+p = 16Ψ/Nd.\n"
      "Computed from these formulas and printed as the paper prints its numbers: 100 GB and up in "
      "whole GB (cut),\nfrom 10 GB one decimal, below 10 GB two (rounded half up).\n\n");
  std::string header = fmt::format("{:>6}", "");
  for (const char* name : T::kModelNames)
    header += fmt::format("  {:^28}", fmt::format("{} Model (GB)", name));
  header.erase(header.find_last_not_of(' ') + 1);
  fmt::print("{}\n{:>6}", header, "DP");
  for (size_t m = 0; m < T::kModelNames.size(); ++m)
    fmt::print("  {:>8}{:>10}{:>10}", "Pos", "Pos+g", "Pos+g+p");
  fmt::print("\n");
  for (size_t row = 0; row < T::kDpDegrees.size(); ++row) {
    fmt::print("{:>6}", T::kDpDegrees[row]);
    for (size_t m = 0; m < T::kModelNames.size(); ++m)
      fmt::print("  {:>8}{:>10}{:>10}", parallel::format_zero_table_gb(t.gb[row][m][0]),
                 parallel::format_zero_table_gb(t.gb[row][m][1]),
                 parallel::format_zero_table_gb(t.gb[row][m][2]));
    fmt::print("\n");
  }
}

// "1.72B", "27.49B", "1.54T": parameters in billions below a trillion.
std::string params_text(double params) {
  return params >= 1e12 ? fmt::format("{:.2f}T", params / 1e12)
                        : fmt::format("{:.2f}B", params / 1e9);
}

std::string size_text(double bytes) {
  return bytes >= parallel::kTiB ? fmt::format("{:.2f} TiB", bytes / parallel::kTiB)
                                 : fmt::format("{:.2f} GiB", bytes / parallel::kGiB);
}

void print_table_infinity_memory() {
  using parallel::format_two_decimals;
  fmt::print(
      "Figure 2a of ZeRO-Infinity (Rajbhandari et al. 2021, arXiv:2104.07857): memory "
      "requirements for massive models,\ncomputed (Note [ZeRO-Infinity memory model], "
      "docs/tables.md). TB = 2^40 bytes, GB = 2^30, K = 1024; mixed-precision Adam,\n"
      "20 bytes per parameter; sequence 1024, batch 32 per node (2 per GPU, 16 GPUs), an "
      "activation checkpoint per block.\n"
      "  model states 20·12·nl·hd²; act. 2·32·seq·nl·(16hd + 2·heads·seq); act. ckpt. "
      "2·32·seq·hd·nl;\n  working memory: model state 4·hd·4hd (the hd x 4hd linear's fp16 "
      "parameters and gradients), act. 2·2·seq·(16hd + 2·heads·seq).\n\n");
  fmt::print("{:46}{:>18}{:>21}\n", "", "TB/Node", "Working mem/GPU (GB)");
  fmt::print("{:>8}{:>8}{:>8}{:>7}{:>15}{:>10}{:>8}{:>13}{:>8}\n", "Params", "", "Hidden", "Attn",
             "Model States", "", "Act.", "Model", "");
  fmt::print("{:>8}{:>8}{:>8}{:>7}{:>15}{:>10}{:>8}{:>13}{:>8}\n", "(T)", "Layers", "Size", "Heads",
             "(TB/Model)", "Act.", "Ckpt.", "State", "Act.");
  std::vector<std::string> differences;
  const auto shapes = parallel::infinity_table_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const parallel::InfinityMemoryRow r = parallel::infinity_memory_row(shapes[i]);
    const std::string cells[6] = {format_two_decimals(r.params / 1e12),
                                  format_two_decimals(r.model_states_bytes / parallel::kTiB),
                                  format_two_decimals(r.activations_bytes / parallel::kTiB),
                                  format_two_decimals(r.checkpoints_bytes / parallel::kTiB),
                                  format_two_decimals(r.model_state_wm_bytes / parallel::kGiB),
                                  format_two_decimals(r.activation_wm_bytes / parallel::kGiB)};
    fmt::print("{:>8}{:>8}{:>8}{:>7}{:>15}{:>10}{:>8}{:>13}{:>8}\n", cells[0], r.shape.layers,
               fmt::format("{}K", r.shape.hidden / 1024), r.shape.heads, cells[1], cells[2],
               cells[3], cells[4], cells[5]);
    static const char* const kColumns[6] = {"params",
                                            "model states",
                                            "activations",
                                            "activation checkpoints",
                                            "model-state working memory",
                                            "activation working memory"};
    for (size_t c = 0; c < 6; ++c)
      if (cells[c] != parallel::kInfinityPaperFigure2a[i][c])
        differences.push_back(fmt::format("{}T row, {}: {} here, {} in the paper",
                                          parallel::kInfinityPaperFigure2a[i][0], kColumns[c],
                                          cells[c], parallel::kInfinityPaperFigure2a[i][c]));
  }
  fmt::print("\nEntries that differ from the paper's printed values: {}\n",
             differences.empty() ? "none" : std::to_string(differences.size()));
  for (const std::string& d : differences) fmt::print("  {}\n", d);
  if (!differences.empty())
    fmt::print(
        "  (the paper's 0.10T model-state working memory, 1.95, is 20·hd² bytes, not the "
        "4·hd·4hd its text and its other\n  four rows use; docs/tables.md)\n");
}

parallel::ClusterSpec parse_cluster(const Args& a) {
  parallel::ClusterSpec c;  // the paper's DGX-2
  auto count = [](const std::string& text, const char* flag) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || v < 1)
      user_error("{} '{}' is not a count; give a whole number of 1 or more", flag, text);
    return static_cast<int64_t>(v);
  };
  if (!a.nodes.empty()) c.nodes = count(a.nodes, "--nodes");
  if (!a.gpus_per_node.empty()) c.gpus_per_node = count(a.gpus_per_node, "--gpus-per-node");
  if (!a.gpu_mem.empty()) c.gpu_bytes = parallel::parse_bytes(a.gpu_mem, "--gpu-mem");
  if (!a.cpu_mem.empty()) c.cpu_bytes = parallel::parse_bytes(a.cpu_mem, "--cpu-mem");
  if (!a.nvme.empty()) c.nvme_bytes = parallel::parse_bytes(a.nvme, "--nvme");
  parallel::validate(c);
  return c;
}

std::string cluster_text(const parallel::ClusterSpec& c) {
  return fmt::format(
      "{} node{} x {} GPU{} (N = {}), {} per GPU; {} CPU memory and {} NVMe per node", c.nodes,
      c.nodes == 1 ? "" : "s", c.gpus_per_node, c.gpus_per_node == 1 ? "" : "s", c.gpus(),
      size_text(c.gpu_bytes), size_text(c.cpu_bytes), size_text(c.nvme_bytes));
}

void print_table_strategies(const parallel::ClusterSpec& cluster) {
  using parallel::Placement;
  fmt::print(
      "The largest model per placement of ZeRO-Infinity's Table 2 (arXiv:2104.07857), by "
      "capacity: model states only,\n20 bytes per parameter (2 fp16 parameters + 18 gradient "
      "and optimizer states); activations and working buffers\nare not counted, so each is an "
      "upper bound (Note [Placement capacities], docs/tables.md).\n"
      "cluster: {}\n\n",
      cluster_text(cluster));
  fmt::print("  {:<16}{:<20}{:<20}{:<32}{:>14}  {}\n", "placement", "parameters",
             "opt. + grad states", "bound", "largest model", "limited by");
  for (Placement p : parallel::kPlacements) {
    const parallel::PlacementCapacity cap = parallel::placement_capacity(p, cluster);
    // {:<32} counts bytes; Ψ, ≤ and · are multi-byte, so pad by hand to the display width.
    std::string bound = parallel::placement_formula(p);
    int width = 0;
    for (unsigned char ch : bound) width += (ch & 0xC0) != 0x80;
    bound += std::string(width < 32 ? 32 - width : 0, ' ');
    fmt::print("  {:<16}{:<20}{:<20}{}{:>14}  {}\n", parallel::placement_name(p),
               parallel::placement_params(p), parallel::placement_states(p), bound,
               params_text(cap.max_params), cap.limit);
  }

  // The paper's claims, on the DGX-2 clusters it names (not the flags above).
  auto dgx2 = [](int64_t nodes, int64_t gpus) {
    parallel::ClusterSpec c;
    c.nodes = nodes;
    c.gpus_per_node = gpus;
    return c;
  };
  auto largest = [](Placement p, const parallel::ClusterSpec& c) {
    return parallel::placement_capacity(p, c).max_params;
  };
  const double nvme1 = largest(Placement::ZeroInfNvme, dgx2(1, 16));
  const double threed1 = largest(Placement::ThreeD, dgx2(1, 16));
  const double nvme32 = largest(Placement::ZeroInfNvme, dgx2(32, 16));
  const double threed32 = largest(Placement::ThreeD, dgx2(32, 16));
  const double offload1 = largest(Placement::ZeroOffload, dgx2(1, 1));
  fmt::print(
      "\nThe paper's claims on DGX-2 nodes (16 x 32 GiB V100, 1.5 TiB CPU, 28 TiB NVMe per "
      "node), beside these bounds:\n");
  fmt::print("  {:<44}{:>8}{:>12}  {}\n", "claim", "paper", "bound here", "bound / claim");
  auto claim = [](const std::string& what, double paper, double ours, const std::string& ours_text,
                  const std::string& paper_text) {
    fmt::print("  {:<44}{:>8}{:>12}  {:.2f}{}\n", what, paper_text, ours_text, ours / paper,
               ours >= paper ? "" : "  (the claim exceeds this bound)");
  };
  claim("ZeRO-Inf-NVMe, 1 node", 1e12, nvme1, params_text(nvme1), "1T");
  claim("3D parallelism, 1 node (Figure 1)", 0.02e12, threed1, params_text(threed1), "0.02T");
  claim("ZeRO-Inf-NVMe / 3D parallelism, 1 node", 50, nvme1 / threed1,
        fmt::format("{:.0f}x", nvme1 / threed1), "~50x");
  claim("ZeRO-Offload, one 32 GB V100", 13e9, offload1, params_text(offload1), "13B");
  claim("ZeRO-Inf-NVMe, 32 nodes (512 GPUs)", 32e12, nvme32, params_text(nvme32), "32T");
  claim("ZeRO-Inf-NVMe / 3D parallelism, 32 nodes", 50, nvme32 / threed32,
        fmt::format("{:.0f}x", nvme32 / threed32), "~50x");
}

void print_table_offload_models(const parallel::ClusterSpec& cluster) {
  fmt::print(
      "ZeRO-Offload's GPT-2 models (Ren et al. 2021, arXiv:2101.06840, Table 3) under "
      "ZeRO-Offload with the paper's MP degree\n(Note [ZeRO-Offload model memory], "
      "docs/tables.md): per GPU the fp16 parameters of one MP slice, fp16 activation\n"
      "checkpoints of every block and one block's activation working memory (sequence 1024, "
      "heads = hidden/128);\nper host the optimizer + gradient states of ZeRO-Infinity's split: "
      "fp16 gradients, fp32 gradients, master\nparameters and Adam moments (18 bytes per "
      "parameter). GiB = 2^30 bytes.\n"
      "fits: one node of {}\n\n",
      cluster_text(cluster));
  fmt::print("  {:<6}{:>7}{:>8}{:>7}{:>4}{:>9}{:>10}{:>8}{:>8}{:>9}{:>10}{:>6}{:>8}\n", "model",
             "layers", "hidden", "batch", "MP", "params", "GPU: par.", "ckpt.", "act.", "total",
             "host", "fits", "min MP");
  for (const parallel::OffloadModel& m : parallel::offload_table_models()) {
    const parallel::OffloadModelMemory mem = parallel::offload_model_memory(m, m.mp);
    const int64_t min_mp = parallel::smallest_fitting_mp(m, cluster);
    auto g = [](double bytes) { return fmt::format("{:.1f}", bytes / parallel::kGiB); };
    fmt::print("  {:<6}{:>7}{:>8}{:>7}{:>4}{:>9}{:>10}{:>8}{:>8}{:>9}{:>10}{:>6}{:>8}\n", m.name,
               m.layers, m.hidden, m.batch_per_gpu, m.mp, params_text(mem.params),
               g(mem.gpu_params_bytes), g(mem.gpu_checkpoints_bytes),
               g(mem.gpu_activation_wm_bytes), g(mem.gpu_bytes()), g(mem.host_bytes),
               parallel::offload_model_fits(m, m.mp, cluster) ? "yes" : "no",
               min_mp == 0 ? std::string("none") : std::to_string(min_mp));
  }
  fmt::print(
      "\n(memory columns in GiB; min MP: the smallest power-of-two MP degree up to the GPUs of "
      "one node with which the\nmodel fits, none if no degree does)\n");
}

void print_stage(const ZeroMemoryConfig& config, double psi,
                 const std::optional<std::vector<parallel::UnitSize>>& units,
                 int64_t persistence_threshold) {
  const parallel::ModelStateMemory m = parallel::model_state_memory(config, psi);
  fmt::print("\nZeRO stage {}: partitions {}; per device = {}\n", config.stage,
             parallel::partitioned_states(config.stage), parallel::formula(config));
  std::optional<parallel::ModelStateBytes> exact;
  if (units) exact = parallel::padded_model_state_bytes(config, *units, persistence_threshold);
  fmt::print("  {:<10}{:>22}{:>12}{:>12}", "", "bytes (formula)", "GiB", "GB");
  if (exact) fmt::print("{:>22}", "bytes (engine)");
  fmt::print("\n");
  struct Row {
    const char* name;
    double formula;
    int64_t engine;
  };
  const Row rows[] = {{"params", m.params, exact ? exact->params : 0},
                      {"grads", m.grads, exact ? exact->grads : 0},
                      {"optimizer", m.optimizer, exact ? exact->optimizer : 0},
                      {"total", m.total(), exact ? exact->total() : 0}};
  for (const Row& r : rows) {
    fmt::print("  {:<10}{:>22}{:>12}{:>12}", r.name, grouped(std::llround(r.formula)),
               gib(r.formula), gb(r.formula));
    if (exact) fmt::print("{:>22}", grouped(r.engine));
    fmt::print("\n");
  }
  if (exact) {
    const int64_t padded = parallel::padded_num_parameters(*units, config.stage, config.dp);
    if (config.stage == 0)
      fmt::print("  engine: stage 0 pads nothing; Ψ in flat buffers = {} elements\n",
                 grouped(padded));
    else
      fmt::print(
          "  engine: each unit padded to a multiple of Nd*16 = {} elements: Ψ_padded = {} "
          "elements{}\n",
          config.dp * parallel::kPartitionAlign, grouped(padded),
          config.stage == 3 ? fmt::format("; units under {} elements keep whole parameters "
                                          "(stage3_param_persistence_threshold)",
                                          grouped(persistence_threshold))
                            : "");
  }
}

int run(const Args& args) {
  const bool cluster_given = !args.nodes.empty() || !args.gpus_per_node.empty() ||
                             !args.gpu_mem.empty() || !args.cpu_mem.empty() || !args.nvme.empty();
  if (args.hardware) {
    if (!args.table.empty() || !args.model.empty() || !args.params.empty() || cluster_given)
      user_error(
          "--hardware measures this machine and takes only --nvme-dir and --probe-mib; run "
          "--table, --model or --params separately");
    print_hardware(args.nvme_dir, args.probe_mib);
    return 0;
  }
  if (!args.table.empty()) {
    static const char* const kTables =
        "zero (Table 1 of the ZeRO paper), infinity-memory (ZeRO-Infinity's Figure 2a), "
        "strategies (the largest model per placement) or offload-models (ZeRO-Offload's GPT-2 "
        "models)";
    const bool known = args.table == "zero" || args.table == "infinity-memory" ||
                       args.table == "strategies" || args.table == "offload-models";
    if (!known) user_error("--table '{}' is not a known table; use {}", args.table, kTables);
    if (args.device != "gpu" && args.device != "cpu")
      user_error(
          "--device '{}': use gpu (the paper's GPU clusters) or cpu (this machine without "
          "a GPU, run.device cpu)",
          args.device);
    if (args.device == "cpu" && args.table != "strategies")
      user_error("--device cpu applies to --table strategies only");
    if (!args.model.empty() || !args.params.empty())
      user_error("--table {} takes no --model or --params: the paper's models are fixed",
                 args.table);
    const bool takes_cluster = args.table == "strategies" || args.table == "offload-models";
    if (cluster_given && !takes_cluster)
      user_error(
          "--table {} has no cluster: --nodes, --gpus-per-node, --gpu-mem, --cpu-mem and --nvme "
          "apply to --table strategies and --table offload-models",
          args.table);
    if (args.table == "zero") print_table_zero();
    if (args.table == "infinity-memory") print_table_infinity_memory();
    if (args.table == "strategies" && args.device == "cpu") {
      if (!args.nodes.empty() || !args.gpus_per_node.empty() || !args.gpu_mem.empty())
        user_error(
            "--device cpu is one machine without a GPU: --nodes, --gpus-per-node and --gpu-mem do "
            "not apply (give --cpu-mem and --nvme, or let them be measured)");
      print_cpu_strategies(args.family, args.cpu_mem, args.nvme, args.nvme_dir, args.max_layers);
      return 0;
    }
    if (args.table == "strategies") print_table_strategies(parse_cluster(args));
    if (args.table == "offload-models") print_table_offload_models(parse_cluster(args));
    return 0;
  }
  if (cluster_given)
    user_error(
        "--nodes, --gpus-per-node, --gpu-mem, --cpu-mem and --nvme describe a cluster for "
        "--table strategies or --table offload-models");
  if (args.model.empty() == args.params.empty())
    user_error(
        "give exactly one of --model NAME (a registry model, e.g. gpt2-medium) or "
        "--params N (a parameter count, e.g. 7.5e9){}",
        args.model.empty() ? "" : "; both were given");
  ZeroMemoryConfig config;
  config.dp = args.dp;
  config.precision = parallel::parse_state_precision(args.precision);
  config.optimizer = parallel::parse_state_optimizer(args.optimizer);
  const std::vector<int> stages = parse_stages(args.stage);
  config.stage = stages.front();
  if (args.dp < 1)
    user_error("--dp {}: the data parallel degree Nd is a number of ranks; use 1 or more", args.dp);
  if (args.persistence_threshold < 0)
    user_error("--stage3-param-persistence-threshold {} must be 0 or more elements",
               args.persistence_threshold);

  if (args.tp < 1)
    user_error("--tp {}: the tensor parallel degree is a number of ranks; use 1 or more", args.tp);
  if (args.tp > 1 && args.model.empty())
    user_error(
        "--tp {} needs --model: which parameters split over tensor-parallel ranks depends "
        "on the model",
        args.tp);

  double psi = 0;
  std::optional<std::vector<parallel::UnitSize>> units;
  std::string tp_line;
  if (!args.model.empty()) {
    const std::string name = resolve_model(args.model);
    psi = static_cast<double>(parallel::registry_num_parameters(name));
    units = parallel::unit_sizes(name, {}, static_cast<int>(args.tp));
    if (args.tp > 1) {
      // Note [Tensor-parallel shards]: Ψ below is one tp rank's, sharded / Nt + replicated.
      const double whole = psi;
      psi = 0;
      for (const parallel::UnitSize& u : *units) psi += static_cast<double>(u.num_parameters);
      tp_line = fmt::format(
          "tensor parallel degree Nt = {}: Ψ above is one tp rank's, of the "
          "model's {} (split matrices / Nt, norms and some biases whole)\n",
          args.tp, grouped(std::llround(whole)));
    }
    const std::string alias = name == args.model ? "" : fmt::format(" ({})", args.model);
    fmt::print("model: {}{}: {}\n", name, alias,
               models::ModelRegistry::global().get(name).description);
    fmt::print("Ψ = {} parameters in {} units\n", grouped(static_cast<int64_t>(psi)),
               units->size());
    fmt::print("{}", tp_line);
  } else {
    psi = parse_params(args.params);
    fmt::print("Ψ = {} parameters (--params {})\n", grouped(std::llround(psi)), args.params);
  }
  const parallel::BytesPerParameter b =
      parallel::bytes_per_parameter(config.precision, config.optimizer);
  fmt::print(
      "precision {}, optimizer {}: per parameter {} bytes params + {} grads + K = {} "
      "optimizer states ({})\n",
      parallel::to_string(config.precision), parallel::to_string(config.optimizer), b.params,
      b.grads, b.optimizer, parallel::optimizer_state_contents(config.precision, config.optimizer));
  fmt::print("data parallel degree Nd = {}\n", config.dp);
  for (int stage : stages) {
    config.stage = stage;
    print_stage(config, psi, units, args.persistence_threshold);
  }
  return 0;
}

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  strata::tools::Args a;
  CLI::App app{"estimate: model-state memory per device under ZeRO-DP (docs/zero.md)", "estimate"};
  app.add_option("--model", a.model, "a registry model (e.g. gpt2, gpt2-medium, llama-7b)");
  app.add_option("--params", a.params, "a parameter count instead of --model (e.g. 7.5e9)");
  app.add_option("--dp", a.dp, "data parallel degree Nd (ranks)")->capture_default_str();
  app.add_option("--tp", a.tp,
                 "tensor parallel degree Nt: per-rank states of a --model split Nt ways")
      ->capture_default_str();
  app.add_option("--stage", a.stage, "ZeRO stage: 0, 1, 2, 3 or all")->capture_default_str();
  app.add_option("--precision", a.precision, "mixed (16-bit params/grads, fp32 master) or fp32")
      ->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "adamw, sgd (with momentum) or sgd-plain")
      ->capture_default_str();
  app.add_option("--stage3-param-persistence-threshold", a.persistence_threshold,
                 "stage 3: units with fewer elements keep whole parameters (engine bytes)")
      ->capture_default_str();
  app.add_option("--table", a.table,
                 "print a paper's table: zero, infinity-memory, strategies, offload-models "
                 "(docs/tables.md)");
  app.add_option("--nodes", a.nodes, "cluster nodes (strategies, offload-models; default 1)");
  app.add_option("--gpus-per-node", a.gpus_per_node, "GPUs per node (default 16)");
  app.add_option("--gpu-mem", a.gpu_mem, "memory per GPU, e.g. 32GiB, 80GB (default 32GiB)");
  app.add_option("--cpu-mem", a.cpu_mem, "CPU memory per node (default 1.5TiB)");
  app.add_option("--nvme", a.nvme, "NVMe per node (default 28TiB)");
  app.add_option("--device", a.device,
                 "--table strategies: gpu (the paper's clusters) or cpu (one machine without a "
                 "GPU, run.device cpu, fp32)")
      ->capture_default_str();
  app.add_option("--hidden", a.family.hidden, "--device cpu: the GPT-2 family's hidden size")
      ->capture_default_str();
  app.add_option("--heads", a.family.heads, "--device cpu: attention heads")->capture_default_str();
  app.add_option("--vocab", a.family.vocab, "--device cpu: vocabulary")->capture_default_str();
  app.add_option("--seq", a.family.seq, "--device cpu: sequence length (= n_positions)")
      ->capture_default_str();
  app.add_option("--micro-batch", a.family.micro_batch, "--device cpu: sequences per micro-batch")
      ->capture_default_str();
  app.add_option("--max-layers", a.max_layers, "--device cpu: the most layers searched")
      ->capture_default_str();
  app.add_flag("--hardware", a.hardware,
               "measure this machine's memory tiers: sizes and bandwidths (docs/tables.md)");
  app.add_option("--nvme-dir", a.nvme_dir,
                 "--hardware, --device cpu: the directory whose drive is measured")
      ->capture_default_str();
  app.add_option("--probe-mib", a.probe_mib, "--hardware: MiB written and read per measurement")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints usage and succeeds; every usage error exits 1 like the others.
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    return strata::tools::run(a);
  } catch (const strata::UserError& e) {
    std::fprintf(stderr, "estimate: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "estimate: internal error: %s\n", e.what());
    return 2;
  }
}
