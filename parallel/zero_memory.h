#pragma once
// Model-state memory per device under ZeRO-DP: the formulas of the ZeRO paper, and the exact
// bytes the engine allocates once its padding is counted. Pure functions, no communicator.
//
// Note [ZeRO memory model]
// Rajbhandari et al. 2019 (arXiv:1910.02054, section 5) count, per parameter, A bytes of
// parameters, B bytes of gradients and K bytes of optimizer states, and Ψ parameters:
//   stage 0 (plain DP)   (A + B + K)Ψ                everything replicated
//   stage 1 (P_os)       (A + B)Ψ + KΨ/Nd            optimizer states partitioned
//   stage 2 (P_os+g)     AΨ + (B + K)Ψ/Nd            ... and gradients
//   stage 3 (P_os+g+p)   (A + B + K)Ψ/Nd             ... and parameters
// Mixed precision (the paper's case, and Strata's GPU default): A = B = 2 (16-bit), and Adam
// keeps an fp32 master copy, m and v: K = 12, so 16Ψ, 4Ψ + 12Ψ/Nd, 2Ψ + 14Ψ/Nd, 16Ψ/Nd.
// fp32 (Strata's CPU default): A = B = 4 and the parameters ARE the master weights, so Adam
// adds only m and v: K = 8, giving 16Ψ, 8Ψ + 8Ψ/Nd, 4Ψ + 12Ψ/Nd, 16Ψ/Nd.
// SGD with momentum keeps one buffer: K = 4 (fp32) or 8 (mixed: master + momentum); without
// momentum K = 0 (fp32) or 4 (mixed: the master copy).
// Model states only: activations, communication buffers, a ZeRO-2 unit's transient full
// gradient and a ZeRO-3 unit's gathered parameters are "residual states" and not counted.
//
// Note [ZeRO padding]
// The formulas use the ideal Ψ/Nd. The engine partitions each unit's flat buffer (Note [Flat
// parameters]: parameters 16-element aligned inside it) into Nd equal contiguous slices, so at
// stages 1-3 it first pads every unit to a multiple of Nd*16 elements: slices are equal and each
// starts 64-byte aligned. Every rank then holds exactly the same bytes, and the exact count is
// the formula with Ψ replaced by Ψ_padded = Σ_units round_up(unit size, Nd*16), whose /Nd is an
// integer. Stage 0 partitions nothing and pads nothing: Ψ_padded = Σ unit sizes. At stage 3 a
// unit smaller than stage3_param_persistence_threshold elements (its size before dp padding)
// keeps its whole parameters on every rank; its gradients and optimizer states are still
// partitioned.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/causal_lm.h"
#include "models/registry.h"

namespace strata::parallel {

enum class StatePrecision { Mixed, FP32 };
enum class StateOptimizer { AdamW, SgdMomentum, Sgd };  // Sgd: without momentum

// "mixed" / "fp32"; "adamw" / "sgd" (with momentum) / "sgd-plain". Parsing raises
// strata::user_error naming the accepted values.
StatePrecision parse_state_precision(std::string_view name);
StateOptimizer parse_state_optimizer(std::string_view name);
std::string to_string(StatePrecision precision);
std::string to_string(StateOptimizer optimizer);

// Note [ZeRO memory model]: A, B and K.
struct BytesPerParameter {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;  // K
  int64_t total() const { return params + grads + optimizer; }
};
BytesPerParameter bytes_per_parameter(StatePrecision precision, StateOptimizer optimizer);
// What the optimizer bytes hold, e.g. "fp32 master weights, m, v".
std::string optimizer_state_contents(StatePrecision precision, StateOptimizer optimizer);

struct ZeroMemoryConfig {
  int stage = 0;   // 0 (plain DP), 1, 2, 3
  int64_t dp = 1;  // Nd
  StatePrecision precision = StatePrecision::Mixed;
  StateOptimizer optimizer = StateOptimizer::AdamW;
};
// strata::user_error for a stage outside 0-3 or dp < 1.
void validate(const ZeroMemoryConfig& config);

// Which model states a stage partitions, e.g. "optimizer states and gradients".
std::string partitioned_states(int stage);
// The per-device formula in the paper's notation for this precision and optimizer,
// e.g. "2Ψ + 14Ψ/Nd" (mixed AdamW, stage 2) or "16Ψ" (stage 0).
std::string formula(const ZeroMemoryConfig& config);

// Bytes per device by the ideal formula (Ψ/Nd need not be whole, hence double).
struct ModelStateMemory {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
ModelStateMemory model_state_memory(const ZeroMemoryConfig& config, double num_parameters);

// ---- the engine's padding (Note [ZeRO padding]) ----

inline constexpr int64_t kPartitionAlign = 16;  // elements; a partition starts 64-byte aligned

// One unit's flat buffer as flatten_parameters lays it out.
struct UnitSize {
  std::string name;            // "embeddings", "h.0", ..., "head"
  int64_t size = 0;            // elements, with the 16-element alignment of each parameter
  int64_t num_parameters = 0;  // elements, without it
};

// A unit's element count as the engine allocates it at `stage` with `dp` ranks.
int64_t padded_unit_size(int64_t unit_size, int stage, int64_t dp);
// Ψ_padded: the sum of padded_unit_size over the units.
int64_t padded_num_parameters(const std::vector<UnitSize>& units, int stage, int64_t dp);

// Exact bytes of one rank's model states (every rank holds the same).
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};
ModelStateBytes padded_model_state_bytes(const ZeroMemoryConfig& config,
                                         const std::vector<UnitSize>& units,
                                         int64_t stage3_param_persistence_threshold = 0);

// ---- Ψ and the units of a model ----

// Ψ of a registry model, from its shape (nothing allocated). strata::user_error for unknown
// names (ModelRegistry::get).
int64_t registry_num_parameters(std::string_view model_name,
                                const models::ModelOptions& options = {});
// The units of a built model, read from its flat_units().
std::vector<UnitSize> unit_sizes(const models::CausalLM& model);
// The units a registry model would have, computed from its family's config without building it
// (a 175B model cannot be built to be measured). Known families: gpt2, llama; any other is a
// strata::user_error saying to build the model and use the overload above. With tp > 1, the
// units of one tensor-parallel rank (Note [Tensor-parallel shards] in models/nn/tensor_parallel.h:
// sharded parameters / tp, replicated ones whole); a user_error naming the numbers when heads,
// key/value heads or the padded vocabulary do not divide by tp.
std::vector<UnitSize> unit_sizes(std::string_view model_name,
                                 const models::ModelOptions& options = {}, int tp = 1);

// ---- Table 1 of the ZeRO paper ----

// Note [ZeRO Table 1]
// Table 1 of arXiv:1910.02054 gives per-device model-state memory in GB (1e9 bytes), mixed
// precision Adam (K = 12), for Ψ = 7.5B, 128B and 1T, Nd = 1, 4, 16, 64, 256, 1024 and
// stages 1, 2, 3. Its numbers follow one printing rule, which format_zero_table_gb applies to
// the formula's values so each entry prints as the paper prints it: 100 GB or more as whole
// GB, cut rather than rounded (4187.5 -> "4187", 257.75 -> "257"); from 10 to 100 GB one
// decimal, below 10 two decimals, both rounded half up (41.25 -> "41.3", 0.46875 -> "0.47");
// trailing zeros dropped ("30", "7.5"). tests/parallel/zero_memory_test.cpp holds the paper's
// printed values and checks each computed value within one unit of the last digit printed.
struct ZeroTable1 {
  static constexpr std::array<double, 3> kModelSizes = {7.5e9, 128e9, 1e12};
  static constexpr std::array<const char*, 3> kModelNames = {"7.5B", "128B", "1T"};
  static constexpr std::array<int64_t, 6> kDpDegrees = {1, 4, 16, 64, 256, 1024};
  static constexpr std::array<int, 3> kStages = {1, 2, 3};
  // gb[row][model][stage - 1]: rows follow kDpDegrees.
  std::array<std::array<std::array<double, 3>, 3>, 6> gb{};
};
ZeroTable1 zero_table1();
std::string format_zero_table_gb(double gb);

}  // namespace strata::parallel
