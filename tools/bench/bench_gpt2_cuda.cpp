// GPT-2 training-step throughput on one GPU: tokens/s and MFU for 124M, 350M, 774M and 1558M.
//
// The models/ layer does not place modules on a GPU yet, so this benchmark runs a GPT-2 step
// directly through the op API on the CUDA backend: for each of the L blocks the forward ops
// (layernorm, c_attn/c_proj/c_fc/mlp.c_proj GEMMs with bias, fused causal attention, GELU,
// residual adds) and their backward ops (two GEMMs per linear, bias sums, layernorm/attention/
// GELU backward), then the tied LM head and the fused softmax + cross-entropy, and the embedding
// backward. It is the same arithmetic as a model step minus the optimizer, so tokens/s and MFU
// are comparable with tools/bench/reference/gpt2_cuda.py (run both with run_gpt2_cuda.sh).
// MFU = 6 N + 12 L T C flops per token (as bench_gpt2_cpu) over the GPU's dense peak
// (--peak-tflops; default 989 = H100 SXM bf16 dense).
//
// usage: bench_gpt2_cuda [--dtype fp32|bf16] [--peak-tflops X] [--steps N] [--models a,b] [--B n]
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"

using namespace strata;
using tensor::Shape;
using tensor::Tensor;

namespace {

struct Config {
  std::string name;
  int64_t n_layer, n_embd, n_head, batch;
};

const Device kGpu = Device::cuda(0);
DType g_mm = DType::BF16;

Tensor param(const Shape& s, uint64_t id) {
  return tensor::randn(s, {1, id}, 0.f, 0.02f, kGpu);
}

// op(a) @ op(b) with a, b cast to g_mm and an f32 output (matmul itself would return g_mm:
// Note [Low-precision ops]).
Tensor mm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tensor out = Tensor::empty({ta ? a.size(1) : a.size(0), tb ? b.size(0) : b.size(1)}, DType::F32,
                             a.device());
  tensor::matmul_out(a.to(g_mm), b.to(g_mm), out, ta, tb);
  return out;
}

// y = x @ w^T (+ b); x [N, K], w [M, K]; GEMM in g_mm with f32 output.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = mm(x, w, false, true);
  return b.defined() ? tensor::bias_add(y, b) : y;
}
// dx = dy @ w; dw = dy^T @ x; db = sum dy.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool bias) {
  Tensor dw = mm(dy, x, true, false);
  if (bias) tensor::sum_to(dy, {w.size(0)});
  return mm(dy, w, false, false);
}

struct Block {
  Tensor ln1w, ln1b, attn_w, attn_b, proj_w, proj_b, ln2w, ln2b, fc_w, fc_b, fc2_w, fc2_b;
};

double step(const Config& c, int64_t T, const std::vector<Block>& blocks, const Tensor& wte,
            const Tensor& wpe, const Tensor& ids, const Tensor& targets) {
  const int64_t B = c.batch, C = c.n_embd, H = c.n_head, D = C / H, N = B * T;
  Tensor pos = tensor::arange(T, DType::I32, kGpu);
  Tensor x = tensor::add(tensor::embedding(wte, ids).view({B, T, C}), tensor::embedding(wpe, pos))
                 .view({N, C});
  struct Saved {
    Tensor x, ln1, ln1m, ln1r, q, k, v, att, attlse, y, x2, ln2, ln2m, ln2r, fc, gel;
  };
  std::vector<Saved> saved;
  for (const Block& b : blocks) {
    Saved s;
    s.x = x;
    auto n1 = tensor::layernorm(x, b.ln1w, b.ln1b, 1e-5f);
    s.ln1 = n1.y, s.ln1m = n1.mean, s.ln1r = n1.rstd;
    Tensor qkv = linear(s.ln1, b.attn_w, b.attn_b).view({B, T, 3, H, D});
    s.q = qkv.select(2, 0).permute({0, 2, 1, 3}).contiguous();
    s.k = qkv.select(2, 1).permute({0, 2, 1, 3}).contiguous();
    s.v = qkv.select(2, 2).permute({0, 2, 1, 3}).contiguous();
    auto a = tensor::attention(s.q, s.k, s.v, true, 0.f);
    s.att = a.out, s.attlse = a.lse;
    s.y = a.out.permute({0, 2, 1, 3}).contiguous().view({N, C});
    s.x2 = tensor::add(x, linear(s.y, b.proj_w, b.proj_b));
    auto n2 = tensor::layernorm(s.x2, b.ln2w, b.ln2b, 1e-5f);
    s.ln2 = n2.y, s.ln2m = n2.mean, s.ln2r = n2.rstd;
    s.fc = linear(s.ln2, b.fc_w, b.fc_b);
    s.gel = tensor::gelu(s.fc);
    x = tensor::add(s.x2, linear(s.gel, b.fc2_w, b.fc2_b));
    saved.push_back(std::move(s));
  }
  Tensor lnfw = tensor::ones({C}, DType::F32, kGpu), lnfb = tensor::zeros({C}, DType::F32, kGpu);
  auto nf = tensor::layernorm(x, lnfw, lnfb, 1e-5f);
  Tensor logits = linear(nf.y, wte, {});
  auto ce = tensor::cross_entropy(logits, targets, -100);
  const double loss = tensor::sum_all(ce.losses).item<float>() / static_cast<double>(N);

  Tensor dloss = tensor::full({N}, 1.0 / static_cast<double>(N), DType::F32, kGpu);
  Tensor dlogits = tensor::cross_entropy_backward(logits, targets, ce.lse, dloss, -100);
  Tensor dx = linear_backward(dlogits, nf.y, wte, false);
  dx = tensor::layernorm_backward(dx, x, lnfw, nf.mean, nf.rstd).dx;
  for (size_t i = blocks.size(); i-- > 0;) {
    const Block& b = blocks[i];
    const Saved& s = saved[i];
    Tensor dgel = linear_backward(dx, s.gel, b.fc2_w, true);
    Tensor dfc = tensor::unary_backward(tensor::UnaryOp::Gelu, s.fc, dgel);
    Tensor dln2 = linear_backward(dfc, s.ln2, b.fc_w, true);
    Tensor dx2 = tensor::add(dx, tensor::layernorm_backward(dln2, s.x2, b.ln2w, s.ln2m, s.ln2r).dx);
    Tensor dy = linear_backward(dx2, s.y, b.proj_w, true);
    Tensor datt = dy.view({B, T, H, D}).permute({0, 2, 1, 3}).contiguous();
    auto g = tensor::attention_backward(s.q, s.k, s.v, s.att, s.attlse, datt, true, 0.f);
    Tensor dqkv = tensor::concat({g.dq.permute({0, 2, 1, 3}).unsqueeze(2),
                                  g.dk.permute({0, 2, 1, 3}).unsqueeze(2),
                                  g.dv.permute({0, 2, 1, 3}).unsqueeze(2)},
                                 2)
                      .view({N, 3 * C});
    Tensor dln1 = linear_backward(dqkv, s.ln1, b.attn_w, true);
    dx = tensor::add(dx2, tensor::layernorm_backward(dln1, s.x, b.ln1w, s.ln1m, s.ln1r).dx);
  }
  Tensor dwte = tensor::zeros(wte.shape(), DType::F32, kGpu);
  tensor::embedding_backward(ids, dx.view({B, T, C}), dwte);
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  double peak_tflops = 989.0;
  int steps = 5;
  int64_t T = 1024, batch_override = 0;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dtype") {
      g_mm = parse_dtype(v);
    } else if (k == "--peak-tflops") {
      peak_tflops = std::atof(v.c_str());
    } else if (k == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (k == "--models") {
      only = v;
    } else if (k == "--B") {
      batch_override = std::atoll(v.c_str());
    } else if (k == "--T") {
      T = std::atoll(v.c_str());
    } else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  try {
    tensor::init_cuda(0);
  } catch (const UserError& e) {
    fmt::print(stderr, "bench_gpt2_cuda: {}\n", e.what());
    return 1;
  }
  // B chosen so activations of a no-checkpointing f32 step fit 80 GB at T = 1024.
  const std::vector<Config> configs = {{"gpt2", 12, 768, 12, 16},
                                       {"gpt2-medium", 24, 1024, 16, 8},
                                       {"gpt2-large", 36, 1280, 20, 4},
                                       {"gpt2-xl", 48, 1600, 25, 2}};
  const int64_t V = 50304;  // GPT-2's 50257 padded to a multiple of 128, as llm.c does
  fmt::print(
      "| model | params | B | T | matmul dtype | step s | tokens/s | TFLOP/s | MFU | loss |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
  for (Config c : configs) {
    if (!only.empty() && only.find(c.name) == std::string::npos) continue;
    if (batch_override > 0) c.batch = batch_override;
    const int64_t C = c.n_embd;
    std::vector<Block> blocks;
    uint64_t id = 10;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      Block b{tensor::ones({C}, DType::F32, kGpu),
              tensor::zeros({C}, DType::F32, kGpu),
              param({3 * C, C}, id++),
              tensor::zeros({3 * C}, DType::F32, kGpu),
              param({C, C}, id++),
              tensor::zeros({C}, DType::F32, kGpu),
              tensor::ones({C}, DType::F32, kGpu),
              tensor::zeros({C}, DType::F32, kGpu),
              param({4 * C, C}, id++),
              tensor::zeros({4 * C}, DType::F32, kGpu),
              param({C, 4 * C}, id++),
              tensor::zeros({C}, DType::F32, kGpu)};
      blocks.push_back(std::move(b));
    }
    Tensor wte = param({V, C}, 1), wpe = param({T, C}, 2);
    std::vector<int64_t> ids(static_cast<size_t>(c.batch * T)), tg(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7919 + 13) % 50257);
      tg[i] = static_cast<int64_t>((i * 104729 + 7) % 50257);
    }
    Tensor x = tensor::from_ints(ids, {c.batch, T}, DType::I32).to(kGpu);
    Tensor y = tensor::from_ints(tg, {c.batch * T}, DType::I32).to(kGpu);
    std::vector<double> times;
    double loss = 0;
    for (int s = 0; s < steps + 1; ++s) {  // the first step warms the allocator and cuBLASLt
      Stopwatch w;
      loss = step(c, T, blocks, wte, wpe, x, y);  // loss.item() synchronises the stream
      if (s > 0) times.push_back(w.seconds());
    }
    const double step_s = median(times), tokens = static_cast<double>(c.batch * T);
    const double n = static_cast<double>(c.n_layer) * 12.0 * static_cast<double>(C * C) +
                     static_cast<double>(V * C);
    const double flops =
        (6.0 * n + 12.0 * static_cast<double>(c.n_layer * T * C)) * tokens / step_s;
    fmt::print("| {} | {:.0f}M | {} | {} | {} | {:.3f} | {:.0f} | {:.1f} | {:.1f}% | {:.4f} |\n",
               c.name, n / 1e6, c.batch, T, dtype_name(g_mm), step_s, tokens / step_s, flops / 1e12,
               100.0 * flops / 1e12 / peak_tflops, loss);
  }
  return 0;
}
