#pragma once
// The largest GPT-2-shaped model that trains on one machine without a GPU (run.device cpu,
// fp32, one process), per placement: what `estimate --table strategies --device cpu` predicts
// and tools/tables.sh measures by training (docs/tables.md).
//
// Note [CPU placement model]
// ZeRO-Infinity's Table 2 bounds (Note [Placement capacities]) count the paper's 20 bytes per
// parameter of mixed-precision model states and nothing else. A CPU run keeps fp32 states, 16
// bytes per parameter (parameters, gradients, AdamW's m and v; no master copy), and the model
// is small enough that the rest of a real run is not negligible. For a GPT-2 of `layers` blocks
// of hidden size hd (the family: hd, heads, vocabulary and sequence fixed, layers varied), the
// bytes a run needs at its peak, by the tier they live on, are the sum of:
//   model states  the engine's exact bytes (parallel::padded_model_state_bytes, Note [ZeRO
//                 padding]): 4 (parameters) + 4 (gradients) + 8 (m, v) per padded element,
//                 on the host, or on NVMe where the placement puts them there; with
//                 offload_optimizer nvme the optimizer keeps an fp32 master beside m and v, 12
//                 bytes per element, as the parameters it updates are on their own tier, and
//                 the gradients are on NVMe as well (4 bytes per element); on NVMe each unit's
//                 partition and each sub-group's states and gradient (a sub-group is a unit)
//                 is a swap extent of whole 1 MiB blocks (offload::NvmeConfig::block_bytes).
//   activations   micro x seq x layers x (16·hd + 2·heads·seq) fp32 values (the per-token
//                 count of Note [ZeRO-Infinity memory model]), plus the logits and their
//                 gradient, 2 x micro x seq x padded vocabulary values.
//   operator working memory  the largest operator's fp32 weight and weight gradient held
//                 beside the flat buffers while it runs: 2 x hd x 4hd values (the paper's
//                 model-state working memory, in fp32).
//   ZeRO-3 unit buffers  at stage 3 with one rank the gathered copy of the unit being run, the
//                 next unit's gathered ahead of use and a unit's whole gradient before its
//                 reduce-scatter: 3 x the largest unit.
//   offload buffers  offload_param nvme: buffer_count (5) buffers of the largest partition,
//                 one more partition being loaded; offload_optimizer nvme: buffer_count (4)
//                 sub-group buffers of 12 bytes per element (master, m, v) and as many
//                 gradient buffers, each of the largest sub-group (a unit here), and the
//                 transient gradient partitions (one reducing, two being written). The
//                 default buffer counts of runtime/train_config.h.
//   start         the start's peak where it exceeds the steady state: none of the placements
//                 here has one (the in-memory run builds what it keeps; ZeRO-3 with offloaded
//                 parameters builds the model unit by unit into its partitions, Note
//                 [Unit-by-unit construction] in parallel/engine.h).
// The host bytes are held to the host memory given (on a real run: run.host_memory_budget,
// which the allocators enforce), the NVMe bytes to the NVMe capacity. Each term is the sum of
// category peaks, not their simultaneous peak, so the prediction errs towards a smaller model.
// What it leaves out: the C++ runtime, the data loader's index and the allocator caches that
// the budget does not count (they are why run.host_memory_budget auto starts from what is free).
#include <cstdint>
#include <string>
#include <vector>

namespace strata::parallel {

// The shape family: everything but the number of blocks.
struct CpuFamily {
  int64_t hidden = 2048;  // ZeRO-Offload's 1B and 2B GPT-2 (Table 3): 20 and 40 layers at 2048
  int64_t heads = 16;
  int64_t vocab = 256;  // byte-level data
  int64_t seq = 128;    // also n_positions
  int64_t micro_batch = 1;
};

// The placements a CPU-only machine has: ZeRO-Offload needs a device to offload from.
enum class CpuPlacement { InMemory, ZeroOffload, ZeroInfCpu, ZeroInfNvme };
inline constexpr CpuPlacement kCpuPlacements[] = {CpuPlacement::InMemory, CpuPlacement::ZeroOffload,
                                                  CpuPlacement::ZeroInfCpu,
                                                  CpuPlacement::ZeroInfNvme};
std::string cpu_placement_name(CpuPlacement placement);  // "in memory", "ZeRO-Inf-NVMe"
// The `train` settings of the placement, e.g. "stage 3, offload_param nvme, offload_optimizer
// nvme"; for ZeRO-Offload why it does not exist on run.device cpu.
std::string cpu_placement_config(CpuPlacement placement);
bool cpu_placement_exists(CpuPlacement placement);  // false for ZeRO-Offload

// One family member's bytes under a placement (Note [CPU placement model]).
struct CpuRunBytes {
  int64_t layers = 0;
  int64_t params = 0;           // Ψ, unpadded
  double host_states = 0;       // model states in host memory (pinned included)
  double activations = 0;       // activations and logits
  double operator_working = 0;  // the largest operator's weight and weight gradient
  double unit_buffers = 0;      // ZeRO-3's gathered and gradient units
  double offload_buffers = 0;   // the NVMe tiers' staging buffers
  double start = 0;             // the start's peak where it exceeds the steady state, else 0
  double nvme = 0;              // model states on NVMe
  double steady_host() const {
    return host_states + activations + operator_working + unit_buffers + offload_buffers;
  }
  double host() const { return steady_host() > start ? steady_host() : start; }
};
// strata::user_error for a family with a size below 1, hidden not divisible by heads, or a
// placement that does not exist here.
CpuRunBytes cpu_run_bytes(CpuPlacement placement, const CpuFamily& family, int64_t layers);

struct CpuPrediction {
  int64_t layers = 0;  // the largest member that fits; 0 when not even one block does
  CpuRunBytes at;      // its bytes (of one block when none fits)
  std::string limit;   // what the next member exceeds: "host memory", "NVMe", "--max-layers"
};
// The largest member of `family` whose host bytes fit `host_bytes` and NVMe bytes `nvme_bytes`,
// searched up to `max_layers` blocks.
CpuPrediction largest_cpu_model(CpuPlacement placement, const CpuFamily& family, double host_bytes,
                                double nvme_bytes, int64_t max_layers = 4096);

// `estimate --table strategies --device cpu` as printed: the family and machine, a row per
// placement (largest_cpu_model; ZeRO-Offload with the reason it does not exist) and the terms of
// each row's model. `host_from` and `nvme_from` say where the sizes came from.
std::string cpu_strategies_table(const CpuFamily& family, double host_bytes,
                                 const std::string& host_from, double nvme_bytes,
                                 const std::string& nvme_from, int64_t max_layers);

}  // namespace strata::parallel
