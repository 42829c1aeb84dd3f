#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "tensor/ops.h"

namespace strata::autograd {

namespace {

struct ByLatestFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

std::shared_ptr<Node> root_node(const Variable& v, int& slot) {
  if (v.is_leaf()) {
    slot = 0;
    return v.grad_accumulator();
  }
  slot = v.output_nr();
  return v.grad_fn();
}

// Note [Summing gradients in place]
// A gradient slot starts as whatever tensor a backward returned, which may also have been handed
// to another input (add's backward returns g twice) or be a view of a live tensor. So the second
// contribution is added in place only when the slot's storage is held by the slot alone (use
// count 1, contiguous, whole storage); otherwise out of place. For GPT-2's tied embedding this
// saves a vocabulary-sized allocation and a pass over it every step. Any float dtype takes the
// in-place path: axpy_ rounds f32(b) + f32(g) once, the same bits add() gives
// (Note [Low-precision ops]).
void accumulate(std::vector<Tensor>& buffer, int slot, Tensor g) {
  if (!g.defined()) return;
  Tensor& b = buffer[slot];
  if (!b.defined()) {
    b = std::move(g);
    return;
  }
  STRATA_CHECK(b.dtype() == g.dtype(), "gradients of one tensor in two dtypes: {} and {}", b.str(),
               g.str());
  const bool exclusive = b.storage().use_count() == 1 && b.is_contiguous() && b.offset() == 0 &&
                         b.nbytes() == b.storage()->nbytes() && is_floating(b.dtype()) &&
                         b.shape() == g.shape() && b.storage() != g.storage();
  if (exclusive) {
    tensor::axpy_(1.f, g, b);
  } else {
    b = tensor::add(b, g);
  }
}

// Note [Gradient dtypes]
// A backward returns each input's gradient in that input's dtype (a bf16 activation gets a bf16
// gradient), so a gradient slot never mixes dtypes and a leaf's gradient has the parameter's
// dtype. Only AccumulateGrad crosses dtypes: it adds into a bound `grad` of any float dtype
// (e.g. f32 master gradients) through axpy_. Checked here for every edge.
void check_grad_dtype(const Node& from, const Edge& e, const Tensor& g) {
  if (!g.defined()) return;
  const DType want = e.node->output_meta[static_cast<size_t>(e.input_nr)].dtype;
  STRATA_CHECK(g.dtype() == want, "'{}' backward returned a {} gradient for a {} input ({})",
               from.name(), dtype_name(g.dtype()), dtype_name(want), g.str());
}

}  // namespace

void backward(const std::vector<Variable>& roots, const std::vector<Tensor>& grads) {
  STRATA_CHECK(grads.empty() || grads.size() == roots.size(), "{} grads for {} roots", grads.size(),
               roots.size());
  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::vector<Node*> stack;
  std::vector<std::pair<std::shared_ptr<Node>, int>> seeds;
  for (const Variable& r : roots) {
    STRATA_CHECK(r.defined() && r.requires_grad(),
                 "backward from a variable that does not require grad (did the forward run under "
                 "NoGradGuard, or do no parameters require grad?)");
    int slot = 0;
    std::shared_ptr<Node> n = root_node(r, slot);
    seeds.emplace_back(n, slot);
    if (keep_alive.emplace(n.get(), n).second) {
      deps.emplace(n.get(), 0);
      stack.push_back(n.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      auto [it, fresh] = deps.emplace(e.node.get(), 0);
      ++it->second;
      if (fresh) {
        keep_alive.emplace(e.node.get(), e.node);
        stack.push_back(e.node.get());
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto buffer_of = [&](Node* n) -> std::vector<Tensor>& {
    auto [it, fresh] = buffers.try_emplace(n);
    if (fresh) it->second.resize(n->num_outputs());
    return it->second;
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    auto& [node, slot] = seeds[i];
    Tensor g = grads.empty() ? Tensor() : grads[i];
    const Tensor& data = roots[i].data();
    if (!g.defined()) {
      STRATA_CHECK(data.numel() == 1, "backward of a non-scalar ({}) needs an explicit gradient",
                   data.str());
      g = tensor::ones(data.shape(), data.dtype(), data.device());
    }
    STRATA_CHECK(g.shape() == data.shape(), "root gradient {} for {}", g.str(), data.str());
    // A caller's gradient (e.g. received from the next pipeline stage) takes the root's dtype
    // (Note [Gradient dtypes]).
    if (g.dtype() != data.dtype()) g = g.to(data.dtype());
    accumulate(buffer_of(node.get()), slot, g);
  }

  std::priority_queue<Node*, std::vector<Node*>, ByLatestFirst> ready;
  for (auto& [node, slot] : seeds)
    if (deps[node.get()] == 0) {
      deps[node.get()] = -1;  // queued
      ready.push(node.get());
    }

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffer_of(n));
    buffers.erase(n);
    bool any = false;
    for (const Tensor& t : in) any = any || t.defined();
    std::vector<Tensor> out;
    bool is_accumulate = dynamic_cast<AccumulateGrad*>(n) != nullptr;
    if (any || is_accumulate) {
      for (size_t i = 0; i < in.size(); ++i)
        if (!in[i].defined() && !is_accumulate) {
          const auto& m = n->output_meta[i];
          in[i] = tensor::zeros(m.shape, m.dtype, m.device);
        }
      for (auto& hook : n->pre_hooks) hook();
      out = n->apply(std::move(in));
      if (auto* f = dynamic_cast<FunctionNode*>(n)) f->release();
    }
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      if (i < out.size()) {
        check_grad_dtype(*n, e, out[i]);
        accumulate(buffer_of(e.node.get()), e.input_nr, std::move(out[i]));
      }
      if (--deps[e.node.get()] == 0) {
        deps[e.node.get()] = -1;
        ready.push(e.node.get());
      }
    }
  }
}

}  // namespace strata::autograd
