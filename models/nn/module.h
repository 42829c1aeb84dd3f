#pragma once
// nn::Module: the base of every layer and model. A module owns named parameters, buffers and
// child modules, and its call wrapper runs forward/backward hooks around `forward`.
//
// Note [Module names]
// Parameters are registered by local name and reached by dotted paths in registration order
// (`h.3.attn.c_attn.weight`), the HF GPT-2 convention, so checkpoints interoperate. A module's
// `path()` and its parameters' Variable names are kept in sync with where it sits in the tree:
// registering a child renames its whole subtree. Init keys, flat-buffer order and checkpoint
// names all come from these full names, never from creation order.
//
// Note [Module hooks]
// Strategies (DP, ZeRO-3, offload) attach to modules without changing model code (docs/design.md
// decision 6). Each call through `operator()` or `call()`:
//   1. runs the forward pre-hooks (inputs),
//   2. if post-backward hooks exist and grad mode is on, routes the inputs that require grad
//      through autograd::on_backward: its callback runs when the gradient leaves the module;
//      if no input requires grad (the first module of a network), the post-backward hooks fire
//      instead once every parameter of the module's subtree has a final gradient for the pass
//      (grad-ready hooks and a counter re-armed by each call),
//   3. runs `forward`,
//   4. runs the forward post-hooks (inputs, outputs),
//   5. if pre-backward hooks exist, routes the outputs through on_backward: its callback runs
//      when the gradient first reaches the module's outputs.
// Nested modules therefore see, in backward: outer pre, inner pre, inner post, outer post.
// Under activation checkpointing the inner modules' forward hooks run again during the
// recompute in backward (and their backward hooks are attached then), as in PyTorch.
// The counter path fires after the last grad-ready hook; grad-ready hooks run in the order they
// were installed, which is at the end of a module's first such call, so inner modules (whose
// calls end first) fire before outer ones.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/variable.h"

namespace strata::models::nn {

using autograd::Variable;
using tensor::Shape;
using tensor::Tensor;

class Module;

using ForwardPreHook = std::function<void(Module&, const std::vector<Variable>& inputs)>;
using ForwardHook = std::function<void(Module&, const std::vector<Variable>& inputs,
                                       const std::vector<Variable>& outputs)>;
using BackwardHook = std::function<void(Module&)>;
using ForwardFn = std::function<std::vector<Variable>(const std::vector<Variable>&)>;

// Returned by the register_*_hook functions; pass to remove_hook.
struct HookHandle {
  uint64_t id = 0;
};

// Note [Deferred initialisation]
// A model larger than host (or GPU) memory cannot be built whole and partitioned afterwards. As
// DeepSpeed's zero.Init does, a model constructed inside a DeferredInitScope gets parameters
// with released storage (Note [Released storage]): register_parameter allocates nothing,
// flatten_parameters binds the variables to released flat buffers without copying or zeroing,
// and the constructor records the seed instead of initialising (CausalLM::initialize). The
// ZeRO-3 engine then calls CausalLM::init_unit(u) for one unit at a time: it materializes the
// unit's flat buffer and initialises it exactly as the constructor would have (Note [Name-keyed
// init]: every draw is keyed by the parameter's name, so the bits do not depend on what else
// exists), and the engine copies the rank's slice into its partition and releases the unit
// again (Note [Unit-by-unit construction] in parallel/engine.h; a bf16/fp16 or GPU model's unit
// is initialised in an fp32 host buffer and cast and copied from there). Scopes nest; per
// thread.
class DeferredInitScope {
 public:
  DeferredInitScope();
  ~DeferredInitScope();
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;
  static bool active();

 private:
  bool saved_;
};

class Module {
 public:
  Module() = default;
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- structure (Note [Module names]) ----
  // Allocates an fp32 parameter of `shape` under Category::Param (contents unspecified until
  // reset_parameters) and registers it; released inside a DeferredInitScope.
  Variable register_parameter(const std::string& name, const Shape& shape);
  // Registers an existing variable as a parameter; it is made to require grad.
  Variable register_parameter(const std::string& name, Variable v);
  // A tensor saved with the module but not trained (e.g. a mask).
  void register_buffer(const std::string& name, Tensor t);
  template <typename M>
  M& register_module(const std::string& name, std::unique_ptr<M> child) {
    M& ref = *child;
    adopt(name, std::move(child));
    return ref;
  }
  // Constructs a child in place: `auto& fc = add_module<Linear>("c_fc", c, 4 * c);`.
  template <typename M, typename... Args>
  M& add_module(const std::string& name, Args&&... args) {
    return register_module(name, std::make_unique<M>(std::forward<Args>(args)...));
  }

  // Recursive, dotted names, registration order (own parameters before children's).
  std::vector<std::pair<std::string, Variable>> named_parameters() const;
  std::vector<Variable> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Pre-order, this module first with the name "".
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, Module*>> named_children();
  // Lookup by dotted name relative to this module; strata::user_error when absent.
  Variable parameter(std::string_view name) const;
  Module& module(std::string_view name);
  // Number of parameter elements in the subtree.
  int64_t num_parameters() const;

  // Dotted path from the root of the tree this module was registered into ("" for a root).
  const std::string& path() const { return path_; }

  // Training mode, recursive. Dropout is the identity in eval mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Zeroes every bound gradient in the subtree (models with flat buffers zero those instead).
  virtual void zero_grad();

  // (Re)initialises the subtree's parameters from `seed`. Every draw is keyed by (seed, the
  // parameter's full name) (models/nn/init.h), so it depends neither on creation order nor on
  // threads. The default recurses into children; layers override to fill their own tensors.
  virtual void reset_parameters(uint64_t seed);

  // ---- hooks (Note [Module hooks]) ----
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  HookHandle register_backward_pre_hook(BackwardHook hook);
  HookHandle register_backward_hook(BackwardHook hook);
  void remove_hook(HookHandle handle);

  // ---- calling ----
  // Runs `forward(x)` wrapped in the hooks. Model code calls children this way.
  Variable operator()(const Variable& x);
  // The general form, for modules whose forward is not Variable -> Variable: `fn` computes the
  // outputs from the (possibly hook-wrapped) inputs.
  std::vector<Variable> call(const std::vector<Variable>& inputs, const ForwardFn& fn);

 protected:
  // The computation; the default raises an internal error (the module has no single-input form).
  virtual Variable forward(const Variable& x);

 private:
  struct HookState;

  void adopt(const std::string& name, std::unique_ptr<Module> child);
  void set_path(const std::string& path);
  void collect_parameters(const std::string& prefix,
                          std::vector<std::pair<std::string, Variable>>& out) const;
  void collect_modules(const std::string& prefix,
                       std::vector<std::pair<std::string, Module*>>& out);
  HookState& hooks();
  void arm_param_counter();

  std::string path_;
  bool training_ = true;
  std::vector<std::pair<std::string, Variable>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  // Shared with backward callbacks (held weakly there), so a graph outliving its module cannot
  // call into freed memory.
  std::shared_ptr<HookState> hooks_;
};

}  // namespace strata::models::nn
