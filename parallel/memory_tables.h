#pragma once
// The memory tables of the ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840) and ZeRO-Infinity
// (Rajbhandari et al. 2021, arXiv:2104.07857) papers, computed from their formulas: pure
// functions behind `estimate --table infinity-memory | strategies | offload-models`
// (docs/tables.md). Table 1 of the ZeRO paper is in parallel/zero_memory.h.
//
// Note [ZeRO-Infinity memory model]
// Section 3 of ZeRO-Infinity: a transformer with nl blocks of hidden size hd has about
// Ψ = 12·nl·hd² parameters (the four linears of a block), and mixed-precision Adam keeps
// 20 bytes per parameter: fp16 parameters (2) and gradients (2), fp32 master parameters,
// gradients, momentum and variance (4 each). Of these, 2 are the parameters and 18 the
// "optimizer + gradient" states that Table 2 of the paper places separately. Its Figure 2a
// assumes a sequence of 1024, a batch of 32 per node (16 GPUs: 2 per GPU) and an activation
// checkpoint at every block (ci = 1). Sizes print in binary units ("TB" = 2^40 bytes, "GB" =
// 2^30) and hidden "10K" is 10·1024: only these reproduce the printed Ψ and memory.
//   model states        20·Ψ                                         (TB per model)
//   activations         2 B · 32 · seq · nl · (16·hd + 2·heads·seq)  (TB per node)
//   act. checkpoints    2 B · 32 · seq · hd · nl / ci                (TB per node)
//   model-state working memory (MSWM)   16·hd²: fp16 parameters and gradients of the largest
//                       operator, the hd x 4hd linear (4 B x hd x 4hd)   (GB per GPU)
//   activation working memory (AWM)     2 B · 2 · seq · ci · (16·hd + 2·heads·seq)  (GB per GPU)
// (16·hd + 2·heads·seq) counts the fp16 values a block keeps per token; the paper prints the
// AWM formula as bsz·seq·ci·(16·hd + 2·heads·seq) bytes, which with its numbers is 2 bytes
// times a per-GPU batch of 2, and gives no formula for the activations column, whose numbers
// are the same per-token count at the node batch of 32. Every entry of Figure 2a follows,
// rounded half up to two decimals, except the MSWM of the 0.10T row: the paper prints 1.95 GB
// where 16·hd² is 1.5625 GB (1.56). 1.95 is 20·hd² bytes (1.953 GB): 5 bytes instead of 4 per
// parameter of the hd x 4hd operator, which none of the other four rows (6.25, 9.77, 64.00,
// 400.00 = 16·hd² exactly) uses; no one formula gives all five.
//
// Note [Placement capacities]
// The largest model a placement holds on a cluster of `nodes` x `gpus_per_node` GPUs (N in
// all) with M_gpu bytes per GPU, M_cpu and M_nvme per node, model states only (the 20 bytes of
// Note [ZeRO-Infinity memory model]; activations, buffers and working memory are not counted,
// so each is an upper bound):
//   data parallel   everything on every GPU:              20Ψ ≤ M_gpu
//   ZeRO-2          parameters whole, the rest partitioned: 2Ψ + 18Ψ/N ≤ M_gpu
//   ZeRO-Offload    fp16 parameters whole on every GPU, the rest partitioned in CPU memory:
//                   2Ψ ≤ M_gpu and 18Ψ/nodes ≤ M_cpu
//   3D parallelism  all partitioned over the GPUs (tp x pp x dp = N): 20Ψ/N ≤ M_gpu
//   ZeRO-3          the same bound as 3D parallelism: 20Ψ/N ≤ M_gpu
//   ZeRO-Inf-CPU    all partitioned in CPU memory (GPUs hold working buffers): 20Ψ ≤ nodes·M_cpu
//   ZeRO-Inf-NVMe   all partitioned on NVMe (CPU and GPU memory stage it):  20Ψ ≤ nodes·M_nvme
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::parallel {

// ---- ZeRO-Infinity Figure 2a (Note [ZeRO-Infinity memory model]) ----

inline constexpr double kInfinityBytesPerParam = 20;
inline constexpr int64_t kInfinitySeq = 1024;
inline constexpr int64_t kInfinityBatchPerNode = 32;
inline constexpr int64_t kInfinityGpusPerNode = 16;
inline constexpr int64_t kInfinityCheckpointInterval = 1;  // ci: blocks between checkpoints
inline constexpr double kTiB = 1099511627776.0;            // the paper's "TB"
inline constexpr double kGiB = 1073741824.0;               // the paper's "GB"

struct TransformerShape {
  int64_t layers = 0;  // nl
  int64_t hidden = 0;  // hd, elements
  int64_t heads = 0;
};

struct InfinityMemoryRow {
  TransformerShape shape;
  double params = 0;                // 12·nl·hd²
  double model_states_bytes = 0;    // per model
  double activations_bytes = 0;     // per node
  double checkpoints_bytes = 0;     // per node
  double model_state_wm_bytes = 0;  // per GPU
  double activation_wm_bytes = 0;   // per GPU
};

// The rows of Figure 2a: (80, 10K, 128), (100, 20K, 160), (128, 25K, 256), (195, 64K, 512),
// (315, 160K, 1024), with K = 1024.
std::vector<TransformerShape> infinity_table_shapes();
InfinityMemoryRow infinity_memory_row(const TransformerShape& shape);
// Figure 2a as the paper prints it, row by row: params (T), model states, activations,
// checkpoints, MSWM, AWM. The reference `estimate` compares its computed table with.
inline constexpr std::array<std::array<const char*, 6>, 5> kInfinityPaperFigure2a = {{
    {"0.10", "1.83", "2.03", "0.05", "1.95", "1.63"},
    {"0.50", "9.16", "3.91", "0.12", "6.25", "2.50"},
    {"1.01", "18.31", "7.13", "0.20", "9.77", "3.56"},
    {"10.05", "182.81", "24.38", "0.76", "64.00", "8.00"},
    {"101.47", "1845.70", "88.59", "3.08", "400.00", "18.00"},
}};
// Two decimals, rounded half up: the paper's printing (24.375 -> "24.38", 1.625 -> "1.63").
std::string format_two_decimals(double value);

// ---- ZeRO-Infinity Table 2: the largest model per placement (Note [Placement capacities]) ----

struct ClusterSpec {
  int64_t nodes = 1;
  int64_t gpus_per_node = 16;
  double gpu_bytes = 32 * kGiB;   // per GPU
  double cpu_bytes = 1.5 * kTiB;  // per node
  double nvme_bytes = 28 * kTiB;  // per node
  int64_t gpus() const { return nodes * gpus_per_node; }
};
// strata::user_error naming the flag (--nodes, --gpus-per-node, --gpu-mem, --cpu-mem, --nvme)
// for a count below 1 or a negative size.
void validate(const ClusterSpec& cluster);

enum class Placement {
  DataParallel,
  Zero2,
  ZeroOffload,
  ThreeD,
  Zero3,
  ZeroInfCpu,
  ZeroInfNvme,
};
inline constexpr std::array<Placement, 7> kPlacements = {
    Placement::DataParallel, Placement::Zero2,      Placement::ZeroOffload, Placement::ThreeD,
    Placement::Zero3,        Placement::ZeroInfCpu, Placement::ZeroInfNvme};

std::string placement_name(Placement placement);  // the paper's: "ZeRO-Inf-NVMe"
// Where the parameters and the optimizer + gradient states live, e.g. "GPU, whole".
std::string placement_params(Placement placement);
std::string placement_states(Placement placement);
std::string placement_formula(Placement placement);  // "2Ψ ≤ M_gpu and 18Ψ/nodes ≤ M_cpu"

struct PlacementCapacity {
  double max_params = 0;
  std::string limit;  // the tier that bounds it: "GPU memory", "CPU memory", "NVMe"
};
PlacementCapacity placement_capacity(Placement placement, const ClusterSpec& cluster);

// ---- ZeRO-Offload Table 3: its GPT-2 configurations under ZeRO-Offload ----

// Note [ZeRO-Offload model memory]
// Table 3 of ZeRO-Offload lists GPT-2 models by layers, hidden size, batch per GPU and the
// model-parallel (MP) degree used with ZeRO-Offload. Ψ is Strata's GPT-2 count for the shape
// (models/gpt2: vocabulary 50257 padded to 50304, 1024 positions, 12·hd² + 13·hd per block).
// Per GPU: the fp16 parameters of one MP slice (2Ψ/mp), the fp16 activation checkpoints of
// every block (2·b·seq·hd·nl; each MP rank keeps its blocks' whole inputs) and the activation
// working memory of one block being recomputed (2·b·seq·(16·hd + 2·heads·seq)/mp, Note
// [ZeRO-Infinity memory model]), with seq = 1024 and heads = hd/128 (the paper gives neither).
// Per host (the node whose CPU memory holds every rank's partition): the 18 bytes of optimizer +
// gradient states that Note [Placement capacities] puts in CPU memory for ZeRO-Offload (fp16
// gradients as they arrive, fp32 gradients, master parameters, momentum and variance), 18Ψ, so
// both tables count the same bytes. GPU gradient buckets and pinned staging buffers are not
// counted.
struct OffloadModel {
  const char* name;  // the paper's label, "10B"
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t batch_per_gpu = 0;
  int64_t mp = 1;
};
inline constexpr int64_t kOffloadSeq = 1024;
inline constexpr int64_t kOffloadHeadDim = 128;

std::vector<OffloadModel> offload_table_models();

struct OffloadModelMemory {
  double params = 0;
  double gpu_params_bytes = 0;
  double gpu_checkpoints_bytes = 0;
  double gpu_activation_wm_bytes = 0;
  double host_bytes = 0;
  double gpu_bytes() const {
    return gpu_params_bytes + gpu_checkpoints_bytes + gpu_activation_wm_bytes;
  }
};
OffloadModelMemory offload_model_memory(const OffloadModel& model, int64_t mp);
// Fits one node of `cluster`: mp <= gpus_per_node, per-GPU bytes <= gpu_bytes, host <= cpu_bytes.
bool offload_model_fits(const OffloadModel& model, int64_t mp, const ClusterSpec& cluster);
// The smallest power-of-two MP degree up to gpus_per_node with which it fits; 0 if none.
int64_t smallest_fitting_mp(const OffloadModel& model, const ClusterSpec& cluster);

// "32GiB", "1.5TiB", "28TB", "512MB", "64": a byte count. Binary suffixes KiB..TiB, decimal
// KB..TB; a bare number is GiB. strata::user_error naming `flag` for anything else.
double parse_bytes(std::string_view text, std::string_view flag);

}  // namespace strata::parallel
