// Fused differentiable functions: a residual add with the norm after it, and GPT-2's MLP as one
// node on the linear-epilogue ops. Forward and backward side by side; each is the composition of
// plain functions it replaces, computed in fewer passes (Note [Fused residual norm] and
// Note [Linear epilogues] in tensor/ops.h say where the bits agree and where they may not).
#include "autograd/functions.h"
#include "autograd/grad_sink.h"
#include "autograd/node.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

namespace {

bool needs(const Variable& v) {
  return v.defined() && v.requires_grad();
}

// v when it is a leaf that requires grad, else none (Note [Weight gradients into their buffer]).
Variable leaf_or_none(const Variable& v) {
  return needs(v) && v.is_leaf() ? v : Variable();
}

// Wraps {s, y} (or {y} alone when !keep_sum) into a node whose backward maps (ds, dy) to the
// inputs' gradients: `grads(dy, ds)` returns {dsum, dweight[, dbias]}; x and r both get dsum.
template <typename Grads>
std::pair<Variable, Variable> add_norm_outputs(const char* name, Tensor s, Tensor y,
                                               const Variable& x, const Variable& r,
                                               std::vector<Variable> params, bool keep_sum,
                                               Grads grads) {
  const bool nx = needs(x), nr = needs(r);
  std::vector<Variable> inputs{x, r};
  inputs.insert(inputs.end(), params.begin(), params.end());
  std::vector<Tensor> outs;
  if (keep_sum) outs.push_back(s);
  outs.push_back(y);
  std::vector<Variable> v =
      make_outputs(name, std::move(outs), inputs, [=](const std::vector<Tensor>& g) {
        // Without keep_sum nobody can have used s: no ds, and no zeros to add.
        const Tensor ds = keep_sum ? g[0] : Tensor();
        std::vector<Tensor> d = grads(keep_sum ? g[1] : g[0], ds);
        std::vector<Tensor> result{nx ? d[0] : Tensor(), nr ? d[0] : Tensor()};
        result.insert(result.end(), d.begin() + 1, d.end());
        return result;
      });
  if (keep_sum) return {v[0], v[1]};
  return {Variable(), v[0]};
}

}  // namespace

std::pair<Variable, Variable> add_layernorm(const Variable& x, const Variable& r,
                                            const Variable& weight, const Variable& bias, float eps,
                                            bool keep_sum) {
  Tensor wd = weight.data();
  tops::AddNormResult f = tops::add_layernorm(x.data(), r.data(), wd, bias.data(), eps);
  Tensor s = f.s, mean = f.mean, rstd = f.rstd;
  // Note [Norm gradients into their buffer] (tensor/ops.h).
  const Variable w_leaf = leaf_or_none(weight), b_leaf = leaf_or_none(bias);
  return add_norm_outputs(
      "AddLayerNorm", f.s, f.y, x, r, {weight, bias}, keep_sum,
      [=](const Tensor& dy, const Tensor& ds) {
        tops::NormGradsInto into;
        const bool in = norm_gradient_sinks(w_leaf, b_leaf, dy.dtype(), into);
        tops::LayerNormGrads d =
            tops::add_layernorm_backward(dy, ds, s, wd, mean, rstd, in ? &into : nullptr);
        return std::vector<Tensor>{d.dx, in ? Tensor() : d.dweight, in ? Tensor() : d.dbias};
      });
}

std::pair<Variable, Variable> add_rmsnorm(const Variable& x, const Variable& r,
                                          const Variable& weight, float eps, bool keep_sum) {
  Tensor wd = weight.data();
  tops::AddNormResult f = tops::add_rmsnorm(x.data(), r.data(), wd, eps);
  Tensor s = f.s, rstd = f.rstd;
  const Variable w_leaf = leaf_or_none(weight);
  return add_norm_outputs(
      "AddRmsNorm", f.s, f.y, x, r, {weight}, keep_sum, [=](const Tensor& dy, const Tensor& ds) {
        tops::NormGradsInto into;
        const bool in = norm_gradient_sinks(w_leaf, Variable(), dy.dtype(), into);
        tops::RmsNormGrads d =
            tops::add_rmsnorm_backward(dy, ds, s, wd, rstd, in ? &into : nullptr);
        return std::vector<Tensor>{d.dx, in ? Tensor() : d.dweight};
      });
}

// Note [GELU recompute]
// The MLP's GELU output h [.., 4C] is as large as its input `pre` and is kept only for proj's
// weight gradient (dW2 = dout^T h). With recompute_gelu the node keeps pre alone and backward
// computes h = gelu(pre) again (one elementwise pass over 4C per token), which frees 4C values
// per token per layer (a quarter of a GPT-2 block's activations) for a few percent of backward
// memory traffic. The recomputed h is bitwise the forward's in f32 on the CPU (the same gelu of
// the same f32 value); in bf16/f16 it is gelu of the rounded pre, rounded, where the forward
// rounded gelu of the unrounded value (Note [Linear epilogues]), and on the GPU cuBLASLt's GELU
// epilogue is NVIDIA's code, not ours: there dW2 may differ from the kept-h one by an ulp of h
// in places. Forward values and the other gradients do not change.
Variable mlp_gelu(const Variable& x, const Variable& fc_weight, const Variable& fc_bias,
                  const Variable& proj_weight, const Variable& proj_bias, bool recompute_gelu) {
  Tensor xd = x.data(), w1 = fc_weight.data(), w2 = proj_weight.data();
  STRATA_CHECK(
      w1.ndim() == 2 && w2.ndim() == 2 && w1.size(1) == xd.size(-1) && w2.size(1) == w1.size(0),
      "mlp_gelu: weights {} and {} for input {}", w1.str(), w2.str(), xd.str());
  const Tensor b1 = fc_bias.defined() ? fc_bias.data() : Tensor();
  const Tensor b2 = proj_bias.defined() ? proj_bias.data() : Tensor();
  // pre = x W1^T + b1 (kept for dgelu), h = gelu(pre) (kept for dW2), out = h W2^T + b2. When no
  // graph is built now or later (evaluation, sampling), pre is not written at all and the GEMM
  // runs GELU_BIAS instead of GELU_AUX_BIAS on a GPU: half its output traffic. A checkpointed
  // block's first run keeps the training path, so its replay computes the same bits
  // (Note [Replayed forwards]).
  const bool graph = GradMode::is_enabled() || GradMode::will_be_replayed();
  tops::LinearResult fc = tops::linear(xd, w1, b1, tops::Activation::Gelu, /*save_pre=*/graph);
  Tensor pre = fc.pre;
  Tensor out = tops::linear(fc.y, w2, b2).y;
  // Note [GELU recompute]: the closure keeps h only when it is not recomputed.
  const Tensor h = recompute_gelu ? Tensor() : fc.y;
  const bool nx = needs(x), nw1 = needs(fc_weight), nb1 = needs(fc_bias), nw2 = needs(proj_weight),
             nb2 = needs(proj_bias);
  // Note [Weight gradients into their buffer]: leaves' gradients may take the products.
  const Variable w1_leaf = leaf_or_none(fc_weight), w2_leaf = leaf_or_none(proj_weight);
  // Note [Bias gradients into their buffer].
  const Variable b1_leaf = leaf_or_none(fc_bias), b2_leaf = leaf_or_none(proj_bias);
  std::vector<Variable> inputs{x, fc_weight, fc_bias, proj_weight, proj_bias};
  return make_output("MlpGelu", out, inputs, [=](const std::vector<Tensor>& g) {
    const Tensor& dout = g[0];
    Tensor dw2, db2, dw1, db1, dx;
    if (nw2) {
      tops::LinearWeightGrads d =
          weight_gradients(w2_leaf, dout, recompute_gelu ? tops::gelu(pre) : h, nb2, b2_leaf);
      dw2 = d.dweight;
      db2 = d.dbias;
    } else if (nb2) {
      db2 = tops::sum_to(dout.reshape({-1, dout.size(-1)}), {dout.size(-1)});
    }
    if (nx || nw1 || nb1) {
      // dpre = (dout W2) * gelu'(pre), and db1 its column sums, from one GEMM.
      Tensor b1_sink = nb1 ? fresh_gradient_sink(b1_leaf, dout.dtype()) : Tensor();
      tops::LinearGeluGrads d =
          tops::linear_backward_gelu(dout, w2, pre, nb1, b1_sink.defined() ? &b1_sink : nullptr);
      db1 = b1_sink.defined() ? Tensor() : d.dbias;
      if (nw1) dw1 = weight_gradients(w1_leaf, d.dpre, xd, false).dweight;
      if (nx) {
        Tensor dpre2 = d.dpre.reshape({-1, d.dpre.size(-1)});
        dx = tops::matmul(dpre2, w1).view(xd.shape());
      }
    }
    return std::vector<Tensor>{dx, dw1, db1, dw2, db2};
  });
}

// Note [SwiGLU recompute]
// Unfused, LLaMA's MLP keeps five tensors per token: x (for both projections' weight gradients),
// g = x Wg^T (for silu's backward), s = silu(g) and u = x Wu^T (for the product's backward) and
// h = s * u (for down_proj's weight gradient): C + 4F values. mlp_swiglu keeps x, g, u and h and
// recomputes s in backward (C + 3F); with recompute_swiglu it keeps x, g and u and recomputes h
// too (C + 2F), one more elementwise pass. Every recomputed value is the same op on the same
// stored inputs as in forward, so the bits are the forward's in every dtype and on every backend,
// and backward runs the unfused nodes' ops in their order: the gradients are the unfused model's
// bits. (x's gradient is the sum of two GEMMs, as the autograd engine adds the two projections'
// contributions; two terms add to the same bits in either order.)
Variable mlp_swiglu(const Variable& x, const Variable& gate_weight, const Variable& up_weight,
                    const Variable& down_weight, bool recompute_swiglu) {
  const Tensor xd = x.data(), wg = gate_weight.data(), wu = up_weight.data(),
               wd = down_weight.data();
  const int64_t C = xd.size(-1), F = wg.size(0);
  STRATA_CHECK(wg.ndim() == 2 && wg.size(1) == C && wu.ndim() == 2 && wu.size(0) == F &&
                   wu.size(1) == C && wd.ndim() == 2 && wd.size(1) == F,
               "mlp_swiglu: weights {}, {} and {} for input {}", wg.str(), wu.str(), wd.str(),
               xd.str());
  const Tensor x2 = xd.reshape({-1, C});
  Tensor g = tops::linear(x2, wg, Tensor()).y;
  Tensor u = tops::linear(x2, wu, Tensor()).y;
  Tensor h = tops::mul(tops::silu(g), u);
  Shape ys = xd.shape();
  ys[ys.ndim() - 1] = wd.size(0);
  const Tensor out = tops::linear(h, wd, Tensor()).y.view(ys);
  // Note [SwiGLU recompute]: s is never kept; h only without recompute_swiglu.
  if (recompute_swiglu) h = Tensor();
  const bool nx = needs(x), nwg = needs(gate_weight), nwu = needs(up_weight),
             nwd = needs(down_weight);
  // Note [Weight gradients into their buffer]: leaves' gradients may take the products.
  const Variable wg_leaf = leaf_or_none(gate_weight), wu_leaf = leaf_or_none(up_weight),
                 wd_leaf = leaf_or_none(down_weight);
  // Mutable: backward drops each kept tensor after its last use, as the unfused nodes' would
  // be dropped node by node (the engine calls a node's backward once, then releases it).
  return make_output(
      "MlpSwiGLU", out, {x, gate_weight, up_weight, down_weight},
      [=](const std::vector<Tensor>& grads) mutable {
        const Tensor dout = grads[0].reshape({-1, wd.size(0)});
        Tensor dx, dwg, dwu, dwd;
        Tensor s = tops::silu(g);
        if (nwd) {
          const Tensor hh = h.defined() ? h : tops::mul(s, u);
          h = Tensor();
          dwd = weight_gradients(wd_leaf, dout, hh, false).dweight;
        }
        h = Tensor();
        if (nx || nwg || nwu) {
          Tensor dh = tops::matmul(dout, wd);
          const Tensor du = tops::mul(dh, s);
          s = Tensor();
          Tensor ds = tops::mul(dh, u);
          dh = Tensor();
          u = Tensor();
          const Tensor dg = tops::unary_backward(tensor::UnaryOp::Silu, g, ds);
          ds = Tensor();
          g = Tensor();
          if (nwg) dwg = weight_gradients(wg_leaf, dg, x2, false).dweight;
          if (nwu) dwu = weight_gradients(wu_leaf, du, x2, false).dweight;
          if (nx) dx = tops::add(tops::matmul(dg, wg), tops::matmul(du, wu)).view(xd.shape());
        }
        return std::vector<Tensor>{dx, dwg, dwu, dwd};
      });
}

}  // namespace strata::autograd
