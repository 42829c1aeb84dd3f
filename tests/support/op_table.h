#pragma once
// The op table: one entry per op family of the op API (tensor/ops.h), naming the Backend methods
// (tensor/backend.h) and differentiable functions (autograd/functions.h) it covers and holding the
// samples every per-op test runs. The tests are parameterized over the entries; adding an op
// means adding its entry here (docs/adding_an_op.md). See Note [Op table].
//
// Note [Op table]
// PyTorch's OpInfo (sample inputs, dtypes, supports_autograd per op) and ggml's test-backend-ops
// (every op on every backend against the CPU) are the models. An entry is an op *family*: the
// forward and backward ops that share a kernel file and whose samples share inputs (a backward
// sample takes the CPU forward's saved tensors, so each kernel is compared on identical inputs).
// Each kind of sample keeps its own shapes and tolerances, written next to the sample with the
// reason. The tests that read the table (one test per entry or per gradcheck sample):
//   gradcheck  tests/autograd/gradcheck_test.cpp: f32 on the CPU against central differences;
//              tests/autograd/lowp_autograd_test.cpp: BF16/F16 inputs, gradients against f32
//   lowp       tests/tensor/lowp_ops_test.cpp: BF16/F16 against round(f32 op), on the CPU
//   cuda       tests/cuda/cuda_ops_test.cpp: CUDA against the CPU in F32/BF16/F16, same bits twice
//   empty      tests/cuda/empty_shapes_cuda_test.cpp: CUDA against the CPU on zero-sized dims
//   random     tests/cuda/random_shapes_cuda_test.cpp: CUDA against the CPU on drawn shapes
//   mixed      tests/cuda/mixed_devices_cuda_test.cpp: an operand on the other device
// tests/autograd/op_table_test.cpp keeps the table complete: every Backend virtual, op API
// function and autograd function must be named by an entry (and every name an entry gives must
// exist), every autograd function needs a gradcheck sample (or a stated exemption), every op API
// function of two or more tensors a mixed sample, and every entry with a Backend method CUDA
// agreement samples of some kind.
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "tensor/ops.h"
#include "tests/support/gradcheck.h"

namespace strata::testing {

using tensor::Shape;
using tensor::Tensor;

// ---- gradcheck (f32, CPU) ----
enum class Layout { Contiguous, Transposed, Strided };
enum class Values { Normal, Positive, AwayFromZero };

struct InputSpec {
  Shape shape;
  Layout layout = Layout::Contiguous;
  Values values = Values::Normal;
};

struct GradSample {
  std::string name;  // unique over the table; the test's name
  std::vector<InputSpec> inputs;
  GradFn fn;
};

// Builds an input of `spec.shape` (requires grad) whose memory layout is as asked: a transposed
// view of a contiguous [.., b, a] tensor, or every other element of a wider one.
autograd::Variable make_grad_input(const InputSpec& spec, uint64_t salt);

// ---- low precision (CPU): BF16/F16 against the f32 op on the widened inputs ----
// What an output's dtype must be: the op's compute dtype, F32 whatever it is, or I64 (indices).
enum class LowpOut : uint8_t { Compute, F32, I64 };

struct LowpSample {
  std::string name;
  // The op's inputs for compute dtype `dt`: float inputs in dt (f32-only ones such as mean/rstd
  // or lse in F32, as the contract says), integer ones as they are.
  std::function<std::vector<Tensor>(DType dt)> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;
  std::vector<LowpOut> outs;
  // Exact ops (copy, fill, embedding forward, dropout, max...) must equal round(f32 op) bit for
  // bit.
  bool exact = false;
  // The CPU widening adapter (Note [Widening adapter]) gives round(f32 op) bit for bit for every
  // op but the native oneDNN bf16 matmul.
  bool adapter_exact = true;
  // Run once per CPU matmul engine (Eigen, and oneDNN when built).
  bool every_matmul_engine = false;
};

// ---- CUDA against the CPU backend (cuda_ops_test.cpp and empty_shapes_cuda_test.cpp) ----
// Builds its inputs on `device` from CPU originals and returns its outputs.
struct DeviceSample {
  std::string name;
  std::function<std::vector<Tensor>(Device)> run;
  double atol = 1e-5, rtol = 1e-4;  // for the F32 run (cuda_ops_test.cpp)
  // Exact ops (Note [Low-precision ops]: copy, fill, casts, embedding forward, dropout, max):
  // the BF16/F16 runs want equal bits.
  bool exact_lowp = false;
};
// The samples of one compute dtype: float inputs are made in F32 on the CPU and converted to dt
// (so the CPU and the GPU see the same rounded values); the contract's F32-only inputs (dloss,
// mean/rstd, lse, rotary tables) stay F32. Backward ops take the forward outputs of the CPU
// backend on both devices.
using DeviceSamples = std::function<std::vector<DeviceSample>(DType dt)>;

// ---- random shapes (random_shapes_cuda_test.cpp) ----
// Shapes and values drawn from a fixed seed.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed), stream_(seed * 1000) {}
  int64_t size(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool coin() { return size(0, 1) == 1; }
  template <typename T>
  T pick(const std::vector<T>& xs) {
    return xs[static_cast<size_t>(size(0, static_cast<int64_t>(xs.size()) - 1))];
  }
  // F32 values on the host; each case converts them to its dtype and device.
  Tensor values(const Shape& s, float lo = -2.f, float hi = 2.f);
  // Integer ids in [0, n), or ignore (-100) where `ignore` says, as I64 on the host.
  Tensor ids(int64_t count, int64_t n, bool ignore = false);

 private:
  std::mt19937_64 rng_;
  uint64_t stream_;
};

// A view of `t` with the same shape but another layout, half the time: the transpose of a
// contiguous transposed copy (strided), or a narrow of a wider buffer (an offset).
Tensor some_layout(Draw& r, const Tensor& t);

struct RandomSample {
  std::string name;
  // The outputs for inputs converted to `dt` on `d`.
  std::function<std::vector<Tensor>(DType dt, Device d)> run;
  double f32_rtol = 1e-4, f32_atol = 1e-5;
  // Outputs that are a sum of two rounded terms (index, the other term's values): their error
  // is relative to the terms' magnitudes, not the sum's, which may cancel.
  std::vector<std::pair<size_t, Tensor>> terms = {};
  // In bf16/f16, the tensor-core attention kernel rounds P and dS to the compute dtype as
  // FlashAttention does (Note [CUDA tensor-core attention]): its outputs are held to the
  // tolerance of attention_strided_cuda_test.cpp, relative to the largest |reference| value.
  // dq and dk (outputs 2 and 3) cancel to zero when every query sees one key (the softmax is 1,
  // so dS = dP - D_i = 0): their reference is then rounding noise, and the scale is at least
  // dv's, which carries the same dO and P and no cancellation.
  bool rounds_intermediates = false;
};

struct RandomFamily {
  // Seeds family * 1000 + draw + 1: the family number fixes the draws of each entry.
  int family = -1;
  std::function<RandomSample(Draw&)> draw;  // null: no random-shape family
};

// ---- operands on two devices (mixed_devices_cuda_test.cpp) ----
// One op API function called with one operand on the other device: a UserError naming both.
struct MixedSample {
  std::string name;                                 // the op API function
  std::function<std::vector<Tensor>(Device)> make;  // the operands, all on one device
  std::function<void(std::vector<Tensor>&)> run;
};

// ---- the entry ----
struct OpInfo {
  std::string name;  // [a-z0-9_]: the test names carry it
  // What the entry covers (checked against the headers by tests/autograd/op_table_test.cpp).
  std::vector<std::string> backend;    // Backend virtual methods
  std::vector<std::string> api;        // op API functions (tensor/ops.h)
  std::vector<std::string> functions;  // autograd functions (autograd/functions.h)
  // The float compute dtypes the ops take (Note [Low-precision ops]: all three, so far); the
  // tests run the dtypes of theirs that are listed here. Differentiable: `functions` not empty.
  std::vector<DType> dtypes = {DType::F32, DType::BF16, DType::F16};
  bool supports(DType dt) const {
    for (DType d : dtypes)
      if (d == dt) return true;
    return false;
  }
  // Autograd functions of this entry that have no gradcheck sample, each with the reason.
  std::vector<std::pair<std::string, std::string>> gradcheck_exempt;

  std::vector<GradSample> gradcheck;
  std::vector<LowpSample> lowp;
  DeviceSamples cuda;   // null: none
  DeviceSamples empty;  // null: none
  RandomFamily random;
  std::vector<MixedSample> mixed;
};

// The whole table, in a fixed order.
const std::vector<OpInfo>& op_table();
// GoogleTest prints a parameter by its name.
inline void PrintTo(const OpInfo& e, std::ostream* os) {
  *os << e.name;
}
// The entries for which `has` is true (for INSTANTIATE_TEST_SUITE_P).
std::vector<OpInfo> op_entries(const std::function<bool(const OpInfo&)>& has);

// Parts of the table, one per file (op_table_*.cpp).
void add_elementwise_ops(std::vector<OpInfo>& table);
void add_reduction_and_memory_ops(std::vector<OpInfo>& table);
void add_linalg_ops(std::vector<OpInfo>& table);
void add_norm_ops(std::vector<OpInfo>& table);
void add_attention_ops(std::vector<OpInfo>& table);
void add_embedding_loss_ops(std::vector<OpInfo>& table);
void add_shape_ops(std::vector<OpInfo>& table);

// Shared sample helpers.
// Uniform values in [lo, hi), a pure function of seed (tensor_test_util.h's rand).
Tensor lowp_rand(const Shape& s, uint64_t seed, float lo = -1.f, float hi = 1.f);
// Inputs in dt from f32 uniform values.
Tensor lp(const Shape& s, uint64_t seed, DType dt, float lo = -1.f, float hi = 1.f);
// The CUDA-agreement inputs: uniform values from stream `stream` of key 42.
Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f);
// The mixed-device operands: uniform values from stream `stream` of key 11, on d.
Tensor mixed_operand(const Shape& s, uint64_t stream, Device d);
// I64 ids 0, 1, ..., n - 1, 0, 1, ... of shape s, on d.
Tensor mixed_ids(const Shape& s, int64_t n, Device d);
// t in dt on d.
inline Tensor on(const Tensor& t, DType dt, Device d) {
  return t.to(dt).to(d);
}

}  // namespace strata::testing
