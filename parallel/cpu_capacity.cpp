#include "parallel/cpu_capacity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/registry.h"
#include "parallel/zero_memory.h"

namespace strata::parallel {

namespace {

constexpr double kF32 = 4;
// The defaults of offload_param.buffer_count and offload_optimizer.buffer_count
// (runtime/train_config.h).
constexpr double kParamBuffers = 5;
constexpr double kOptimizerBuffers = 4;
// offload::NvmeConfig::block_bytes: each swap extent is a whole number of blocks.
constexpr double kNvmeBlock = 1048576;

double whole_blocks(double bytes) {
  return std::ceil(bytes / kNvmeBlock) * kNvmeBlock;
}

models::ModelOptions family_options(const CpuFamily& f, int64_t layers) {
  models::ModelOptions o;
  o.overrides = {{"n_layer", std::to_string(layers)},
                 {"n_embd", std::to_string(f.hidden)},
                 {"n_head", std::to_string(f.heads)},
                 {"vocab_size", std::to_string(f.vocab)},
                 {"n_positions", std::to_string(f.seq)}};
  return o;
}

}  // namespace

std::string cpu_placement_name(CpuPlacement p) {
  switch (p) {
    case CpuPlacement::InMemory:
      return "in memory";
    case CpuPlacement::ZeroOffload:
      return "ZeRO-Offload";
    case CpuPlacement::ZeroInfCpu:
      return "ZeRO-Inf-CPU";
    case CpuPlacement::ZeroInfNvme:
      return "ZeRO-Inf-NVMe";
  }
  STRATA_UNREACHABLE();
}

std::string cpu_placement_config(CpuPlacement p) {
  switch (p) {
    case CpuPlacement::InMemory:
      return "stage 0";
    case CpuPlacement::ZeroOffload:
      return "no GPU: run.device cpu has no device memory to offload from";
    case CpuPlacement::ZeroInfCpu:
      return "stage 3, offload_param cpu";
    case CpuPlacement::ZeroInfNvme:
      return "stage 3, offload_param nvme, offload_optimizer nvme";
  }
  STRATA_UNREACHABLE();
}

bool cpu_placement_exists(CpuPlacement p) {
  return p != CpuPlacement::ZeroOffload;
}

CpuRunBytes cpu_run_bytes(CpuPlacement p, const CpuFamily& f, int64_t layers) {
  STRATA_USER_CHECK(layers >= 1 && f.hidden >= 1 && f.heads >= 1 && f.vocab >= 1 && f.seq >= 1 &&
                        f.micro_batch >= 1,
                    "a GPT-2 family needs layers, hidden size, heads, vocabulary, sequence and "
                    "micro-batch of 1 or more (got {}, {}, {}, {}, {}, {})",
                    layers, f.hidden, f.heads, f.vocab, f.seq, f.micro_batch);
  STRATA_USER_CHECK(f.hidden % f.heads == 0, "--hidden {} is not divisible by --heads {}", f.hidden,
                    f.heads);
  STRATA_USER_CHECK(cpu_placement_exists(p), "{}: {}", cpu_placement_name(p),
                    cpu_placement_config(p));
  // Note [CPU placement model].
  const models::ModelOptions options = family_options(f, layers);
  const std::vector<UnitSize> units = unit_sizes("gpt2-tiny", options);
  const models::ModelShape shape = models::ModelRegistry::global().shape("gpt2-tiny", options);
  ZeroMemoryConfig zc;
  zc.stage = p == CpuPlacement::InMemory ? 0 : 3;
  zc.dp = 1;
  zc.precision = StatePrecision::FP32;
  zc.optimizer = StateOptimizer::AdamW;
  const ModelStateBytes states = padded_model_state_bytes(zc, units);
  int64_t largest_unit = 0;
  for (const UnitSize& u : units)
    largest_unit = std::max(largest_unit, padded_unit_size(u.size, zc.stage, 1));
  const double unit = static_cast<double>(largest_unit);

  const double hd = static_cast<double>(f.hidden),
               tokens = static_cast<double>(f.micro_batch * f.seq);
  const double vocab = static_cast<double>(std::max(shape.padded_vocab_size, shape.vocab_size));
  CpuRunBytes r;
  r.layers = layers;
  r.params = shape.num_parameters;
  r.activations = kF32 * tokens *
                  (static_cast<double>(layers) *
                       (16 * hd + 2 * static_cast<double>(f.heads) * static_cast<double>(f.seq)) +
                   2 * vocab);
  r.operator_working = kF32 * 2 * hd * 4 * hd;
  if (zc.stage == 3) r.unit_buffers = kF32 * 3 * unit;
  const double params = static_cast<double>(states.params);
  const double grads = static_cast<double>(states.grads);
  const double optimizer = static_cast<double>(states.optimizer);
  if (p == CpuPlacement::ZeroInfNvme) {
    // The gradients are on NVMe too (Note [Gradients on the NVMe tier] in
    // parallel/grad_buckets.h): nothing of the model states stays on the host.
    r.host_states = 0;
    // One extent per unit's partition (4 bytes per element), one per optimizer sub-group (a
    // unit: sub_group_size is 10^9 elements by default; NvmeAdamW keeps an fp32 master beside m
    // and v, 12 bytes per element, as the parameters it updates live on their own tier) and one
    // per sub-group's gradient (4 bytes per element), each rounded up to whole blocks.
    for (const UnitSize& u : units) {
      const double n = static_cast<double>(padded_unit_size(u.size, zc.stage, 1));
      r.nvme += whole_blocks(kF32 * n) + whole_blocks(3 * kF32 * n) + whole_blocks(kF32 * n);
    }
    // Parameter buffers and the partition being loaded; sub-group buffers (12 bytes per
    // element) and as many gradient buffers; the transient gradient partitions, the one reducing
    // and two being written.
    r.offload_buffers =
        kF32 * unit * ((kParamBuffers + 1) + 3 * kOptimizerBuffers + kOptimizerBuffers + 3);
    // No start term: with offload_param a CPU fp32 run builds the model unit by unit into its
    // partitions (Note [Unit-by-unit construction] in parallel/engine.h), whose peak, one unit
    // and its partition beside the tier's buffers, is below the steady state counted here.
  } else {
    r.host_states = params + grads + optimizer;
  }
  return r;
}

CpuPrediction largest_cpu_model(CpuPlacement p, const CpuFamily& f, double host_bytes,
                                double nvme_bytes, int64_t max_layers) {
  STRATA_USER_CHECK(max_layers >= 1, "--max-layers {} must be 1 or more", max_layers);
  auto fits = [&](const CpuRunBytes& b) { return b.host() <= host_bytes && b.nvme <= nvme_bytes; };
  auto limit_of = [&](const CpuRunBytes& b) {
    return b.host() > host_bytes ? std::string("host memory") : std::string("NVMe");
  };
  // Every term grows with the layers, so the members that fit are a prefix: bisect it.
  CpuPrediction out;
  CpuRunBytes first = cpu_run_bytes(p, f, 1);
  if (!fits(first)) {
    out.at = first;
    out.limit = limit_of(first);
    return out;
  }
  int64_t lo = 1, hi = max_layers + 1;  // lo fits; hi does not (or is past the cap)
  CpuRunBytes at_lo = first;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    CpuRunBytes b = cpu_run_bytes(p, f, mid);
    if (fits(b)) {
      lo = mid;
      at_lo = b;
    } else {
      hi = mid;
    }
  }
  out.layers = lo;
  out.at = at_lo;
  out.limit = hi > max_layers ? std::string("--max-layers") : limit_of(cpu_run_bytes(p, f, hi));
  return out;
}

std::string cpu_strategies_table(const CpuFamily& f, double host, const std::string& host_from,
                                 double nvme, const std::string& nvme_from, int64_t max_layers) {
  constexpr double kGiB = 1073741824.0;
  auto size_text = [](double bytes) { return fmt::format("{:.2f} GiB", bytes / 1073741824.0); };
  std::string out;
  out += fmt::format(
      "The largest GPT-2-shaped model per placement on one machine without a GPU: run.device "
      "cpu, fp32 (16 bytes per parameter\nof model states), one process. Model states, "
      "activations, working and offload buffers counted (Note [CPU placement model]\nin "
      "parallel/cpu_capacity.h, docs/tables.md).\n"
      "family: GPT-2, hidden {}, {} heads, vocabulary {}, sequence {} (= n_positions), "
      "micro-batch {}; layers varied\n"
      "machine: 1 node, 0 GPUs; host memory {} ({}), NVMe {} ({})\n\n",
      f.hidden, f.heads, f.vocab, f.seq, f.micro_batch, size_text(host), host_from, size_text(nvme),
      nvme_from);
  out += fmt::format("  {:<16}{:>7}{:>11}{:>10}{:>10}  {:<13}{}\n", "placement", "layers", "params",
                     "host GiB", "NVMe GiB", "limited by", "train settings");
  std::vector<std::pair<std::string, CpuRunBytes>> terms;
  for (CpuPlacement p : kCpuPlacements) {
    if (!cpu_placement_exists(p)) {
      out += fmt::format("  {:<16}{:>7}{:>11}{:>10}{:>10}  {:<13}{}\n", cpu_placement_name(p), "-",
                         "-", "-", "-", "-", cpu_placement_config(p));
      continue;
    }
    const CpuPrediction pr = largest_cpu_model(p, f, host, nvme, max_layers);
    auto g = [](double bytes) { return fmt::format("{:.2f}", bytes / kGiB); };
    out +=
        fmt::format("  {:<16}{:>7}{:>11}{:>10}{:>10}  {:<13}{}\n", cpu_placement_name(p), pr.layers,
                    pr.layers == 0 ? std::string("-") : fmt::format("{:.2f}M", pr.at.params / 1e6),
                    g(pr.at.host()), pr.at.nvme > 0 ? g(pr.at.nvme) : std::string("-"), pr.limit,
                    cpu_placement_config(p));
    terms.emplace_back(cpu_placement_name(p), pr.at);
  }
  out += fmt::format(
      "\nHost bytes of each row's model (GiB; of one block where none fits): model states on the "
      "host + activations + operator\nworking memory + ZeRO-3 unit buffers + offload buffers "
      "(or the start's peak where larger); NVMe: model states there.\n");
  out += fmt::format("  {:<16}{:>8}{:>8}{:>9}{:>8}{:>9}{:>8}{:>8}{:>8}\n", "placement", "states",
                     "act.", "op. wm", "units", "offload", "start", "host", "NVMe");
  for (const auto& [name, b] : terms) {
    auto g = [](double bytes) { return fmt::format("{:.3f}", bytes / kGiB); };
    out += fmt::format("  {:<16}{:>8}{:>8}{:>9}{:>8}{:>9}{:>8}{:>8}{:>8}\n", name, g(b.host_states),
                       g(b.activations), g(b.operator_working), g(b.unit_buffers),
                       g(b.offload_buffers), g(b.start), g(b.host()), g(b.nvme));
  }
  return out;
}

}  // namespace strata::parallel
