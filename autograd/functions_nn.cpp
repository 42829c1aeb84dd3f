// Linear algebra, normalisation, attention, embedding and loss: forward and backward side by side.
#include <array>

#include "autograd/functions.h"
#include "autograd/grad_sink.h"
#include "autograd/node.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

namespace {
bool needs(const Variable& v) {
  return v.defined() && v.requires_grad();
}

// Sums the leading (batch) dims away: [..., R, C] -> [R, C].
Tensor sum_batch(const Tensor& t, int keep_dims) {
  Tensor r = t;
  while (r.ndim() > keep_dims) r = tops::sum(r, 0);
  return r;
}

// Note [Norm gradients into their buffer] (tensor/ops.h): only leaves' gradients can take them.
Variable leaf_or_none(const Variable& v) {
  return needs(v) && v.is_leaf() ? v : Variable();
}
}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool ta, bool tb) {
  Tensor ad = a.data(), bd = b.data();
  bool na = needs(a), nb = needs(b);
  // Note [Weight gradients into their buffer]: only a leaf's gradient can take the product.
  const Variable b_leaf = nb && b.is_leaf() ? b : Variable();
  return make_output(
      "Matmul", tops::matmul(ad, bd, ta, tb), {a, b}, [=](const std::vector<Tensor>& gs) {
        const Tensor& g = gs[0];
        Tensor ga, gb;
        // C = op(a) op(b): d op(a) = g op(b)^T, d op(b) = op(a)^T g.
        if (na) {
          ga = tops::matmul(g, bd, false, !tb);  // d op(a), [..., M, K]
          if (ta) ga = ga.transpose(-1, -2).contiguous();
        }
        if (nb) {
          if (bd.ndim() == 2 && ad.ndim() >= 2 && !ta) {
            // Shared b: fold the batch into rows so one GEMM sums over it.
            Tensor a2 = ad.reshape({-1, ad.size(-1)});
            Tensor g2 = g.reshape({-1, g.size(-1)});
            // Note [Weight gradients into their buffer]: e.g. GPT-2's tied head.
            Tensor sink = gradient_sink(b_leaf, g.dtype());
            if (sink.defined() && ad.dtype() == g.dtype()) {
              if (tb)
                tops::matmul_out(g2, a2, sink, true, false, 1.f, 1.f);
              else
                tops::matmul_out(a2, g2, sink, true, false, 1.f, 1.f);
            } else {
              gb = tb ? tops::matmul(g2, a2, true, false) : tops::matmul(a2, g2, true, false);
            }
          } else {
            gb = tb ? tops::matmul(g, ad, true, ta) : tops::matmul(ad, g, !ta, false);
            if (bd.ndim() == 2) gb = sum_batch(gb, 2);
          }
        }
        return std::vector<Tensor>{ga, gb};
      });
}

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  Tensor xd = x.data(), wd = weight.data();
  int64_t in = xd.size(-1), out_features = wd.size(0);
  STRATA_CHECK(wd.ndim() == 2 && wd.size(1) == in, "linear: weight {} for input {}", wd.str(),
               xd.str());
  Tensor x2 = xd.reshape({-1, in});
  // The bias rides in the GEMM's epilogue (Note [Linear epilogues] in tensor/ops.h).
  Shape ys = xd.shape();
  ys[ys.ndim() - 1] = out_features;
  Tensor y = tops::linear(x2, wd, bias.defined() ? bias.data() : Tensor()).y.view(ys);
  bool nx = needs(x), nw = needs(weight), nb = needs(bias);
  // Note [Weight gradients into their buffer]: only a leaf's gradient can take the product.
  const Variable w_leaf = nw && weight.is_leaf() ? weight : Variable();
  const Variable b_leaf = leaf_or_none(bias);  // Note [Bias gradients into their buffer]
  std::vector<Variable> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  return make_output("Linear", y, inputs, [=](const std::vector<Tensor>& gs) {
    Tensor g2 = gs[0].reshape({-1, out_features});
    std::vector<Tensor> grads;
    grads.push_back(nx ? tops::matmul(g2, wd).view(xd.shape()) : Tensor());
    Tensor dw, db;
    if (nw) {
      // Note [Weight gradients into their buffer]: dw is undefined when it went there.
      tops::LinearWeightGrads d = weight_gradients(w_leaf, g2, x2, nb, b_leaf);
      dw = d.dweight;
      db = d.dbias;
    } else if (nb) {
      db = tops::sum_to(g2, {out_features});
    }
    grads.push_back(dw);
    if (bias.defined()) grads.push_back(db);
    return grads;
  });
}

Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias, float eps) {
  Tensor xd = x.data(), wd = weight.data();
  tops::NormResult r = tops::layernorm(xd, wd, bias.data(), eps);
  Tensor mean = r.mean, rstd = r.rstd;
  const Variable w_leaf = leaf_or_none(weight), b_leaf = leaf_or_none(bias);
  return make_output("LayerNorm", r.y, {x, weight, bias}, [=](const std::vector<Tensor>& g) {
    tops::NormGradsInto into;
    const bool in = norm_gradient_sinks(w_leaf, b_leaf, g[0].dtype(), into);
    tops::LayerNormGrads d =
        tops::layernorm_backward(g[0], xd, wd, mean, rstd, in ? &into : nullptr);
    return std::vector<Tensor>{d.dx, in ? Tensor() : d.dweight, in ? Tensor() : d.dbias};
  });
}

Variable rmsnorm(const Variable& x, const Variable& weight, float eps) {
  Tensor xd = x.data(), wd = weight.data();
  tops::NormResult r = tops::rmsnorm(xd, wd, eps);
  Tensor rstd = r.rstd;
  const Variable w_leaf = leaf_or_none(weight);
  return make_output("RmsNorm", r.y, {x, weight}, [=](const std::vector<Tensor>& g) {
    tops::NormGradsInto into;
    const bool in = norm_gradient_sinks(w_leaf, Variable(), g[0].dtype(), into);
    tops::RmsNormGrads d = tops::rmsnorm_backward(g[0], xd, wd, rstd, in ? &into : nullptr);
    return std::vector<Tensor>{d.dx, in ? Tensor() : d.dweight};
  });
}

Variable softmax(const Variable& x) {
  Tensor y = tops::softmax(x.data());
  return make_output("Softmax", y, {x}, [y](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{tops::softmax_backward(y, g[0])};
  });
}

Variable attention(const Variable& q, const Variable& k, const Variable& v, bool causal,
                   float scale) {
  Tensor qd = q.data(), kd = k.data(), vd = v.data();
  tops::AttentionResult r = tops::attention(qd, kd, vd, causal, scale);
  Tensor out = r.out, lse = r.lse;
  return make_output("Attention", r.out, {q, k, v}, [=](const std::vector<Tensor>& g) {
    tops::AttentionGrads d = tops::attention_backward(qd, kd, vd, out, lse, g[0], causal, scale);
    return std::vector<Tensor>{d.dq, d.dk, d.dv};
  });
}

namespace {
// The [B, H, T, D] views of q, k and v in a contiguous packed [B, T, 3 * H * D] buffer.
std::array<Tensor, 3> qkv_heads(const Tensor& packed, int64_t n_head) {
  const int64_t B = packed.size(0), T = packed.size(1), D = packed.size(2) / (3 * n_head);
  Tensor parts = packed.view({B, T, 3, n_head, D});
  return {parts.select(2, 0).transpose(1, 2), parts.select(2, 1).transpose(1, 2),
          parts.select(2, 2).transpose(1, 2)};
}
}  // namespace

Variable attention_qkv(const Variable& qkv, int64_t n_head, bool causal, float scale) {
  STRATA_CHECK(qkv.data().ndim() == 3 && n_head > 0 && qkv.size(2) % (3 * n_head) == 0,
               "attention_qkv: qkv {} is not [B, T, 3 * n_head * head_dim] for n_head {}",
               qkv.data().str(), n_head);
  const Tensor packed = qkv.data().contiguous();  // a linear's output already is: no copy
  const std::array<Tensor, 3> heads = qkv_heads(packed, n_head);
  tops::AttentionResult r = tops::attention(heads[0], heads[1], heads[2], causal, scale);
  const Tensor out = r.out, lse = r.lse;
  // out is a [B, T, H, D] buffer (tensor::attention), so this is a view.
  Tensor y = out.transpose(1, 2).view({packed.size(0), packed.size(1), packed.size(2) / 3});
  return make_output("AttentionQKV", y, {qkv}, [=](const std::vector<Tensor>& g) {
    const Tensor dy = g[0].contiguous().view(out.transpose(1, 2).shape()).transpose(1, 2);
    Tensor dqkv = Tensor::empty(packed.shape(), packed.dtype(), packed.device());
    const std::array<Tensor, 3> d = qkv_heads(dqkv, n_head);
    tops::attention_backward_into(heads[0], heads[1], heads[2], out, lse, dy, causal, scale, d[0],
                                  d[1], d[2]);
    return std::vector<Tensor>{dqkv};
  });
}

Variable rotary(const Variable& x, const Tensor& cos, const Tensor& sin) {
  return make_output("Rotary", tops::rotary(x.data(), cos, sin, false), {x},
                     [cos, sin](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{tops::rotary(g[0], cos, sin, true)};
                     });
}

Variable embedding(const Variable& weight, const Tensor& ids) {
  Shape ws = weight.shape();
  DType wt = weight.dtype();
  Device dev = weight.device();
  // Note [Weight gradients into their buffer]: the scatter adds into the table's gradient
  // buffer itself (embedding_backward accumulates), with no zeroed table and no add after.
  const Variable w_leaf = needs(weight) && weight.is_leaf() ? weight : Variable();
  return make_output("Embedding", tops::embedding(weight.data(), ids), {weight},
                     [=](const std::vector<Tensor>& g) {
                       Tensor sink = gradient_sink(w_leaf, g[0].dtype());
                       if (sink.defined()) {
                         tops::embedding_backward(ids, g[0], sink);
                         return std::vector<Tensor>{Tensor()};
                       }
                       Tensor dw = tops::zeros(ws, wt, dev);
                       tops::embedding_backward(ids, g[0], dw);
                       return std::vector<Tensor>{dw};
                     });
}

// Note [Logits gradient in place]
// The logits are the largest tensor of a language model's step (GPT-2 124M at B = 128, T = 1024:
// 6.6 G bf16 elements, 12.3 GiB), and an out-of-place backward allocates their gradient beside
// them, at the point where every activation is still alive: the step's peak. Their gradient is
// elementwise given the lse the forward kept, so the backward writes it over the logits when
// nothing else can see them: the node's saved copy holds the only reference to their storage
// (the caller dropped its logits, and no view of them is alive), the storage holds exactly
// these logits, and they are contiguous. A node runs its backward once (it is released after),
// so no later pass reads the overwritten logits. The bits are those of the out-of-place kernel.
// A caller that keeps the logits (or a view of them) gets the out-of-place gradient and its
// logits untouched.
namespace {
bool logits_are_ours(const Tensor& ld) {
  return ld.storage().use_count() == 1 && ld.is_contiguous() && ld.offset() == 0 &&
         ld.nbytes() == ld.storage()->nbytes() && is_floating(ld.dtype());
}
}  // namespace

Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index,
                       int64_t classes) {
  Tensor ld = logits.data();
  tops::CrossEntropyResult r = tops::cross_entropy(ld, targets, ignore_index, classes);
  // The mean over the counted rows, on the loss's device (no wait for a GPU): sum * (1 / m),
  // m = max(1, count) (with no counted row the sum is 0 either way).
  const Tensor m = r.norm.narrow(0, 0, 1).reshape({});
  const Tensor inv_m = r.norm.narrow(0, 1, 1).reshape({});
  Tensor loss = tops::mul(tops::sum_all(r.losses), inv_m);
  Tensor lse = r.lse;
  int64_t rows = r.losses.size(0);
  return make_output("CrossEntropy", loss, {logits}, [=](const std::vector<Tensor>& g) {
    // d mean / d loss_row = g / m for every counted row (ignored rows are zeroed by the op).
    Tensor dloss = tops::div(g[0], m).reshape({1}).expand(Shape{rows});
    if (logits_are_ours(ld)) {  // Note [Logits gradient in place]
      Tensor d = ld;
      tops::cross_entropy_backward_(d, targets, lse, dloss, ignore_index, classes);
      return std::vector<Tensor>{d};
    }
    return std::vector<Tensor>{
        tops::cross_entropy_backward(ld, targets, lse, dloss, ignore_index, classes)
            .view(ld.shape())};
  });
}

// Note [Fused cross-entropy gradient]
// The logits' gradient is elementwise given the lse and dloss = g / m on every counted row, where
// g is the gradient the mean loss receives, and a training loop knows g before the forward: 1
// over the accumulation steps, times the fp16 loss scale (Trainer and bench_gpt2_cuda set it with
// a LossGradientScope; Engine::loss_gradient). With it, cross_entropy_consuming runs the forward
// and the backward in one pass over the logits (tensor::cross_entropy_fused_; on the GPU, Note
// [CUDA fused cross-entropy]): the logits, GPT-2's largest tensor (13.2 GB for 124M at B = 128),
// come from device memory once instead of twice, a third less traffic for the loss, and the
// gradient is written over them, so the memory is that of Note [Logits gradient in place].
// It applies only when nothing else can see the logits: the caller moved its Variable in, no
// other Variable shares its node, their storage has no other handle (logits_are_ours), grad mode
// is on and they need a gradient; otherwise the result is cross_entropy's. The node then keeps
// the gradient instead of the logits. Its backward compares the gradient it receives with the
// scope's on the device (tensor::scale_unless_equal_, no wait): equal, which is what the loops
// ensure (the same float products the backward makes), it passes the gradient on untouched, with
// the unfused path's bits; different (a model that weights its loss, a loop that scales it
// another way), it rescales it by received / expected, still without a wait: two roundings more
// than the unfused path (the ratio and the rescaled value, in the logits' dtype), so within a few
// units of roundoff of it when the ratio is moderate (exact for a power of two, but for f16's
// subnormals). A ratio far from 1 costs f16 more: the gradient was rounded at the wrong scale,
// so values underflow (received >> expected) or overflow to inf (received << expected) first.
// Set a scope only where the loss's gradient is known.
namespace {
thread_local std::optional<float> t_loss_gradient;
}  // namespace

LossGradientScope::LossGradientScope(float grad) : previous_(t_loss_gradient) {
  t_loss_gradient = grad;
}

LossGradientScope::~LossGradientScope() {
  t_loss_gradient = previous_;
}

std::optional<float> LossGradientScope::current() {
  return t_loss_gradient;
}

Variable cross_entropy_consuming(Variable&& logits_in, const Tensor& targets, int64_t ignore_index,
                                 int64_t classes) {
  Variable logits = std::move(logits_in);
  const std::optional<float> grad = LossGradientScope::current();
  if (!grad || !GradMode::is_enabled() || !logits.requires_grad() || logits.use_count() != 1 ||
      !logits_are_ours(logits.data()))
    return cross_entropy(logits, targets, ignore_index, classes);
  Tensor d = logits.data();  // a second handle on the storage, also ours
  tops::CrossEntropyResult r = tops::cross_entropy_fused_(d, targets, *grad, ignore_index, classes);
  const Tensor inv_m = r.norm.narrow(0, 1, 1).reshape({});
  Tensor loss = tops::mul(tops::sum_all(r.losses), inv_m);
  const float expected = *grad;
  return make_output("CrossEntropy", loss, {logits}, [=](const std::vector<Tensor>& g) {
    Tensor dlogits = d;
    tops::scale_unless_equal_(dlogits, g[0], expected);
    return std::vector<Tensor>{dlogits};
  });
}

}  // namespace strata::autograd
