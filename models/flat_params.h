#pragma once
// Flat parameter and gradient buffers, one pair per unit.
//
// Note [Flat parameters]
// A *unit* is the granularity strategies work at: the embeddings, one transformer block, the
// head. After a model is built, `flatten_parameters` moves the parameters of each unit into ONE
// contiguous fp32 buffer (Category::Param) in name-sorted order, each parameter's offset aligned
// to `align` elements (16 = 64 bytes: a cache line, an AVX-512 vector), and rebinds every
// parameter Variable's data to a view into it (Variable::set_data). Likewise it binds each
// parameter's gradient to a view into a zeroed flat gradient buffer (Category::Grad), so backward
// accumulates straight into the buffer (Note [Variables and leaves]). Alignment padding is zero
// in both buffers and no view covers it, so it stays zero: a ZeRO partition, a DP bucket, the
// optimizer or a checkpoint can treat a unit as one tensor.
// Invariants: each parameter belongs to exactly one unit; `names`, `offsets`, `numels`,
// `shapes` and `variables` are parallel arrays sorted by name; views never overlap. Rebinding a
// parameter's data or grad elsewhere (set_data/set_grad) breaks the aliasing — don't.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "models/nn/module.h"

namespace strata::models {

struct FlatUnit {
  std::string name;                   // "embeddings", "h.0", ..., "head"
  std::vector<std::string> prefixes;  // module paths whose parameters the unit holds
  std::vector<std::string> users;     // UnitSpec::users
  std::vector<std::string> names;     // full parameter names, sorted
  std::vector<int64_t> offsets;       // element offset of each parameter in `params`/`grads`
  std::vector<int64_t> numels;
  std::vector<tensor::Shape> shapes;
  std::vector<autograd::Variable> variables;
  tensor::Tensor params;  // [size], contiguous: f32, or bf16/f16 under mixed precision
  tensor::Tensor grads;   // [size], contiguous, the dtype of params

  int64_t size() const { return params.numel(); }  // including alignment padding
  int64_t num_parameters() const;                  // excluding it
};

// Which modules' parameters go into a unit: a parameter belongs to the unit whose prefix equals
// its module path or is a dotted ancestor of it.
struct UnitSpec {
  std::string name;
  std::vector<std::string> prefixes;
  // Modules outside `prefixes` that use the unit's parameters without owning any (GPT-2's tied
  // head `lm_head` reads wte): strategies that must see every use of a unit (ZeRO-3 gathering)
  // hook these modules too (Note [ZeRO-3 gathering] in parallel/zero3.h).
  std::vector<std::string> users = {};
};

// Note [Flat parameters]. Copies current parameter values into the buffers (so it can run before
// or after init) and zeroes the gradients. Every parameter of `root` must match exactly one unit.
std::vector<FlatUnit> flatten_parameters(nn::Module& root, const std::vector<UnitSpec>& units,
                                         int64_t align = 16);

// Zeroes every unit's gradient buffer (padding included) in one fill each. A buffer whose
// storage is released (Note [Released storage]: ZeRO-2/3 keep full gradients only transiently)
// holds nothing and is skipped.
void zero_flat_grads(std::vector<FlatUnit>& units);

// Grows every unit's buffers to a multiple of `multiple` elements (ZeRO partitions: dp * 16, so
// each rank's slice is whole cache lines): allocates new zeroed params/grads buffers of the same
// categories, copies the values over and rebinds every parameter's data and grad to views of
// them (the old buffers are freed once nothing else holds them). The new tail is padding: zero,
// covered by no view, so it stays zero (Note [Flat parameters]). Call before anything else keeps
// views of the old buffers (optimizer groups, saved activations). A unit already a multiple is
// left as it is. A unit whose buffers are both released (Note [Deferred initialisation] in
// models/nn/module.h) gets released ones of the new size.
void repad_flat_units(std::vector<FlatUnit>& units, int64_t multiple);

// Converts every unit's params and grads to `dtype` (BF16/F16 for mixed precision, F32 back):
// new buffers of the same categories, values rounded to nearest even, every parameter's data and
// grad rebound (Note [Mixed precision] in parallel/engine.h). Same preconditions as repad.
void cast_flat_units(std::vector<FlatUnit>& units, DType dtype);

// Moves every unit's params and grads to `device` (the model zoo builds on the host; `train` on
// the GPU moves the units before making the Engine): new buffers of the same size, dtype and
// categories there, values copied exactly, every parameter's data and grad rebound. A unit
// already on `device` is left as it is (so moving to where the units are is the identity). Same
// preconditions as repad.
void move_flat_units(std::vector<FlatUnit>& units, Device device);

// Binds the unit's parameter views (every variable's data) to `params`, a flat buffer of the
// unit's size in any dtype and on any device, and returns the buffer they were bound to; the
// gradients are left alone. Unit-by-unit construction (Note [Unit-by-unit construction] in
// parallel/engine.h) initialises a unit of a low-precision or GPU model in an fp32 host buffer
// this way, then binds the unit back to its own (released) buffer.
tensor::Tensor rebind_unit_params(FlatUnit& unit, tensor::Tensor params);

}  // namespace strata::models
