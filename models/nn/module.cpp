#include "models/nn/module.h"

#include <algorithm>

#include "autograd/hooks.h"
#include "offload/memory_stats.h"

namespace strata::models::nn {

// Hook lists plus the post-backward counter (Note [Module hooks]). Backward callbacks hold this
// weakly; `module` is cleared when the module dies.
struct Module::HookState {
  Module* module = nullptr;
  uint64_t next_id = 1;
  std::vector<std::pair<uint64_t, ForwardPreHook>> forward_pre;
  std::vector<std::pair<uint64_t, ForwardHook>> forward_post;
  std::vector<std::pair<uint64_t, BackwardHook>> backward_pre;
  std::vector<std::pair<uint64_t, BackwardHook>> backward_post;
  // Counter path for post-backward when no input requires grad.
  bool param_hooks_installed = false;
  int64_t num_counted = 0;  // parameters carrying our grad-ready hook
  int64_t pending = 0;      // still to become final in this pass
  bool armed = false;

  void fire(std::vector<std::pair<uint64_t, BackwardHook>> HookState::*list) {
    if (!module) return;
    // Copy: a hook may remove itself.
    auto hooks = this->*list;
    for (auto& [id, h] : hooks) h(*module);
  }
};

Module::~Module() {
  if (hooks_) hooks_->module = nullptr;
}

// ---- structure ----

namespace {
thread_local bool g_deferred_init = false;
}

DeferredInitScope::DeferredInitScope() : saved_(g_deferred_init) {
  g_deferred_init = true;
}

DeferredInitScope::~DeferredInitScope() {
  g_deferred_init = saved_;
}

bool DeferredInitScope::active() {
  return g_deferred_init;
}

Variable Module::register_parameter(const std::string& name, const Shape& shape) {
  offload::CategoryScope scope(offload::Category::Param);
  Tensor data = DeferredInitScope::active() ? Tensor::empty_released(shape, DType::F32)
                                            : Tensor::empty(shape, DType::F32);
  return register_parameter(name, Variable(std::move(data), true));
}

Variable Module::register_parameter(const std::string& name, Variable v) {
  STRATA_CHECK(!name.empty() && name.find('.') == std::string::npos,
               "parameter name '{}' must be non-empty and without dots", name);
  for (auto& [n, p] : params_) STRATA_CHECK(n != name, "parameter '{}' registered twice", name);
  STRATA_CHECK(v.defined() && v.is_leaf(), "parameter '{}' must be a leaf variable", name);
  if (!v.requires_grad()) v.set_requires_grad(true);
  v.set_name(path_.empty() ? name : path_ + "." + name);
  params_.emplace_back(name, v);
  return v;
}

void Module::register_buffer(const std::string& name, Tensor t) {
  for (auto& [n, b] : buffers_) STRATA_CHECK(n != name, "buffer '{}' registered twice", name);
  buffers_.emplace_back(name, std::move(t));
}

void Module::adopt(const std::string& name, std::unique_ptr<Module> child) {
  STRATA_CHECK(!name.empty(), "child modules need a name");
  for (auto& [n, c] : children_) STRATA_CHECK(n != name, "module '{}' registered twice", name);
  child->set_path(path_.empty() ? name : path_ + "." + name);
  children_.emplace_back(name, std::move(child));
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& [n, p] : params_) p.set_name(path_.empty() ? n : path_ + "." + n);
  for (auto& [n, c] : children_) c->set_path(path_.empty() ? n : path_ + "." + n);
}

void Module::collect_parameters(const std::string& prefix,
                                std::vector<std::pair<std::string, Variable>>& out) const {
  for (auto& [n, p] : params_) out.emplace_back(prefix + n, p);
  for (auto& [n, c] : children_) c->collect_parameters(prefix + n + ".", out);
}

std::vector<std::pair<std::string, Variable>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Variable>> out;
  collect_parameters("", out);
  return out;
}

std::vector<Variable> Module::parameters() const {
  std::vector<Variable> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, b] : buffers_) out.emplace_back(n, b);
  for (auto& [cn, c] : children_)
    for (auto& [n, b] : c->named_buffers()) out.emplace_back(cn + "." + n, b);
  return out;
}

void Module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (auto& [n, c] : children_) c->collect_modules(prefix.empty() ? n : prefix + "." + n, out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [n, c] : children_) out.emplace_back(n, c.get());
  return out;
}

Variable Module::parameter(std::string_view name) const {
  for (auto& [n, p] : named_parameters())
    if (n == name) return p;
  user_error("module '{}' has no parameter '{}'", path_, name);
}

Module& Module::module(std::string_view name) {
  for (auto& [n, m] : named_modules())
    if (n == name) return *m;
  user_error("module '{}' has no submodule '{}'", path_, name);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& [n, p] : named_parameters()) p.zero_grad();
}

void Module::reset_parameters(uint64_t seed) {
  for (auto& [n, c] : children_) c->reset_parameters(seed);
}

// ---- hooks ----

Module::HookState& Module::hooks() {
  if (!hooks_) {
    hooks_ = std::make_shared<HookState>();
    hooks_->module = this;
  }
  return *hooks_;
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  HookState& h = hooks();
  h.forward_pre.emplace_back(h.next_id, std::move(hook));
  return {h.next_id++};
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  HookState& h = hooks();
  h.forward_post.emplace_back(h.next_id, std::move(hook));
  return {h.next_id++};
}

HookHandle Module::register_backward_pre_hook(BackwardHook hook) {
  HookState& h = hooks();
  h.backward_pre.emplace_back(h.next_id, std::move(hook));
  return {h.next_id++};
}

HookHandle Module::register_backward_hook(BackwardHook hook) {
  HookState& h = hooks();
  h.backward_post.emplace_back(h.next_id, std::move(hook));
  return {h.next_id++};
}

void Module::remove_hook(HookHandle handle) {
  if (!hooks_) return;
  auto drop = [&](auto& list) {
    std::erase_if(list, [&](const auto& e) { return e.first == handle.id; });
  };
  drop(hooks_->forward_pre);
  drop(hooks_->forward_post);
  drop(hooks_->backward_pre);
  drop(hooks_->backward_post);
}

// Installs (once) a grad-ready hook on every trainable parameter of the subtree and re-arms the
// per-pass counter. Called after forward so inner modules' hooks are installed first (Note
// [Module hooks]).
void Module::arm_param_counter() {
  HookState& h = hooks();
  if (!h.param_hooks_installed) {
    h.param_hooks_installed = true;
    std::weak_ptr<HookState> weak = hooks_;
    for (auto& [n, p] : named_parameters()) {
      if (!p.requires_grad()) continue;
      ++h.num_counted;
      p.add_grad_ready_hook([weak](Variable&) {
        std::shared_ptr<HookState> s = weak.lock();
        if (!s || !s->armed) return;
        if (--s->pending == 0) {
          s->armed = false;
          s->fire(&HookState::backward_post);
        }
      });
    }
  }
  h.pending = h.num_counted;
  h.armed = h.num_counted > 0;
}

// ---- calling ----

namespace {
bool any_requires_grad(const std::vector<Variable>& vs) {
  return std::any_of(vs.begin(), vs.end(),
                     [](const Variable& v) { return v.defined() && v.requires_grad(); });
}

// autograd::on_backward over the defined entries of `vs` (an optional input may be undefined).
std::vector<Variable> route_through(const std::vector<Variable>& vs, std::function<void()> cb) {
  std::vector<Variable> defined;
  for (const Variable& v : vs)
    if (v.defined()) defined.push_back(v);
  std::vector<Variable> routed = autograd::on_backward(defined, std::move(cb));
  std::vector<Variable> out = vs;
  size_t k = 0;
  for (Variable& v : out)
    if (v.defined()) v = routed[k++];
  return out;
}
}  // namespace

Variable Module::forward(const Variable&) {
  STRATA_CHECK(false, "module '{}' has no single-input forward; call it through its own API",
               path_);
  return {};
}

Variable Module::operator()(const Variable& x) {
  return call({x}, [this](const std::vector<Variable>& in) {
    return std::vector<Variable>{forward(in[0])};
  })[0];
}

std::vector<Variable> Module::call(const std::vector<Variable>& inputs, const ForwardFn& fn) {
  if (!hooks_) return fn(inputs);  // the common case: no strategy attached
  std::shared_ptr<HookState> state = hooks_;
  // Iterate over copies: a hook may add or remove hooks.
  for (auto& [id, h] : std::vector(state->forward_pre)) h(*this, inputs);

  const bool grad = autograd::GradMode::is_enabled();
  std::vector<Variable> in = inputs;
  bool counter_path = false;
  if (grad && !state->backward_post.empty()) {
    if (any_requires_grad(in)) {
      std::weak_ptr<HookState> weak = state;
      in = route_through(in, [weak] {
        if (auto s = weak.lock()) s->fire(&HookState::backward_post);
      });
    } else {
      counter_path = true;
    }
  }

  std::vector<Variable> out = fn(in);

  if (counter_path) arm_param_counter();
  for (auto& [id, h] : std::vector(state->forward_post)) h(*this, inputs, out);
  if (grad && !state->backward_pre.empty()) {
    if (any_requires_grad(out)) {
      std::weak_ptr<HookState> weak = state;
      out = route_through(out, [weak] {
        if (auto s = weak.lock()) s->fire(&HookState::backward_pre);
      });
    }
  }
  return out;
}

}  // namespace strata::models::nn
