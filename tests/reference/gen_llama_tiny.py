#!/usr/bin/env python3
"""Reference values for tests/models/llama_reference_test.cpp, made with plain PyTorch.

A tiny LLaMA written out by hand, mirroring Meta's reference model and HF's LlamaForCausalLM:
pre-norm decoder layers, RMSNorm (x * rsqrt(mean(x^2) + eps) * w, no bias), bias-free q/k/v/o
projections, rotary embedding on q and k with theta 10000, grouped-query attention (k/v head j
serves query heads j*rep .. j*rep + rep - 1, HF's repeat_kv), causal softmax attention with
1/sqrt(head_dim) scaling, SwiGLU MLP down(silu(gate(x)) * up(x)), final RMSNorm and an LM head
(untied, or tied to embed_tokens). Parameter names are Strata's (HF LLaMA without the "model."
prefix) and Linear weights are [out, in] as in HF.

Rotary convention (Note [LLaMA rotary convention] in models/llama/rotary.h): features are rotated
in interleaved pairs (2i, 2i+1), Meta's convention and tensor::rotary's. HF's rotate_half pairs
(i, i + D/2) instead; `check_hf_equivalence` runs an HF-style rotate_half forward on q_proj/k_proj
rows permuted as HF's convert_llama_weights_to_hf.py does, and asserts the logits agree, so the
weight permutation documented in the Note is checked here.

Weights are drawn in fp32 with torch.manual_seed; the forward, backward and AdamW steps then run in
float64 so that the stored values (rounded to fp32) carry no fp32 accumulation noise of their own:
the C++ test's differences are Strata's error alone.

Files written next to this script (safetensors written by hand, as gen_gpt2_tiny.py does):
  llama_tiny.safetensors       vocab 64, 4 heads / 2 k/v heads (GQA), untied head; also the
                               parameters after 10 AdamW steps
  llama_tiny_tied.safetensors  vocab 61 padded to 64, 4 heads / 4 k/v heads, head tied to
                               embed_tokens, one target = -100 (ignore_index)
Each holds: the weights (by parameter name), "tokens" and "targets" (i64 [B, T]), "logits"
([B, T, padded_vocab]), "loss" ([1]), "grad.<name>" for every parameter, and "adamw.losses"
([11]: the loss before each of 10 AdamW steps and after the last). AdamW: lr 1e-3, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D parameters only (two param groups). The config
is in the header's __metadata__ (HF LlamaConfig names).

Run: python3 tests/reference/gen_llama_tiny.py   (a few seconds on CPU; torch only)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt2_tiny import loss_fn, write_safetensors  # noqa: E402  (same file format and loss)

HERE = os.path.dirname(os.path.abspath(__file__))


def make_params(cfg, seed):
    """fp32 weights in Strata's names and layouts. Scales are larger than LLaMA's init (and the
    RMSNorm weights are not 1) so every term of the computation matters to the outputs."""
    torch.manual_seed(seed)
    C, L, Fh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    V, Vp = cfg["vocab_size"], cfg["padded_vocab_size"]
    D = C // cfg["num_attention_heads"]
    KV = cfg["num_key_value_heads"] * D
    p = {}

    def normal(*shape, std):
        return torch.randn(*shape, dtype=torch.float32) * std

    emb = normal(Vp, C, std=0.5)
    emb[V:] = 0.0  # padded rows start at zero (Note [Padded vocabulary])
    p["embed_tokens.weight"] = emb
    for i in range(L):
        h = f"layers.{i}."
        p[h + "input_layernorm.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "self_attn.q_proj.weight"] = normal(C, C, std=0.2)
        p[h + "self_attn.k_proj.weight"] = normal(KV, C, std=0.2)
        p[h + "self_attn.v_proj.weight"] = normal(KV, C, std=0.2)
        p[h + "self_attn.o_proj.weight"] = normal(C, C, std=0.1)
        p[h + "post_attention_layernorm.weight"] = 1.0 + normal(C, std=0.1)
        p[h + "mlp.gate_proj.weight"] = normal(Fh, C, std=0.15)
        p[h + "mlp.up_proj.weight"] = normal(Fh, C, std=0.15)
        p[h + "mlp.down_proj.weight"] = normal(C, Fh, std=0.1)
    p["norm.weight"] = 1.0 + normal(C, std=0.1)
    if not cfg["tie_word_embeddings"]:
        head = normal(Vp, C, std=0.15)
        head[V:] = 0.0
        p["lm_head.weight"] = head
    return p


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary_interleaved(x, theta):
    """x [B, T, heads, D]: pairs (2i, 2i+1) rotated by t * theta^(-2i/D)."""
    T, D = x.shape[1], x.shape[3]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = ang.cos()[None, :, None, :].to(x.dtype), ang.sin()[None, :, None, :].to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def rotary_rotate_half(x, theta):
    """HF's apply_rotary_pos_emb on x [B, T, heads, D]: pairs (i, i + D/2)."""
    T, D = x.shape[1], x.shape[3]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    cos, sin = emb.cos()[None, :, None, :].to(x.dtype), emb.sin()[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def forward(p, cfg, ids, rotary=rotary_interleaved):
    B, T = ids.shape
    C, H, KVH = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, rep = C // H, H // KVH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = p["embed_tokens.weight"][ids]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["num_hidden_layers"]):
        h = f"layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = (a @ p[h + "self_attn.q_proj.weight"].T).reshape(B, T, H, D)
        k = (a @ p[h + "self_attn.k_proj.weight"].T).reshape(B, T, KVH, D)
        v = (a @ p[h + "self_attn.v_proj.weight"].T).reshape(B, T, KVH, D)
        q, k = rotary(q, theta), rotary(k, theta)
        # repeat_kv: [B, T, KVH, D] -> [B, T, KVH * rep, D], head j repeated in place.
        k = k[:, :, :, None, :].expand(B, T, KVH, rep, D).reshape(B, T, H, D)
        v = v[:, :, :, None, :].expand(B, T, KVH, rep, D).reshape(B, T, H, D)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D ** 0.5)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "self_attn.o_proj.weight"].T
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        g = F.silu(m @ p[h + "mlp.gate_proj.weight"].T)
        x = x + (g * (m @ p[h + "mlp.up_proj.weight"].T)) @ p[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["norm.weight"], eps)
    head = p["embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return x @ head.T  # [B, T, padded_vocab]


def hf_permute(w, n_heads):
    """convert_llama_weights_to_hf.py's permute: Meta's interleaved q/k rows -> HF rotate_half."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def strata_from_hf(w, n_heads):
    """The inverse, as Note [LLaMA rotary convention] writes it for loading HF checkpoints."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def check_hf_equivalence(p, cfg, tokens, logits):
    hf = dict(p)
    for n in p:
        if n.endswith("q_proj.weight"):
            hf[n] = hf_permute(p[n], cfg["num_attention_heads"])
        elif n.endswith("k_proj.weight"):
            hf[n] = hf_permute(p[n], cfg["num_key_value_heads"])
        if n.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads" if "q_proj" in n else "num_key_value_heads"]
            assert torch.equal(strata_from_hf(hf[n], heads), p[n]), n
    hf_logits = forward(hf, cfg, tokens, rotary=rotary_rotate_half)
    diff = (hf_logits - logits).abs().max().item()
    assert diff < 1e-10, f"HF rotate_half forward with permuted q/k disagrees: {diff}"
    print(f"  HF rotate_half + permuted q/k_proj agrees with interleaved: max diff {diff:.1e}")


def generate(filename, cfg, seed, B, T, ignore=(), save_final=False, adamw_steps=10):
    p32 = make_params(cfg, seed)
    names = list(p32)
    g = torch.Generator().manual_seed(seed + 1)
    seq = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    for b, t in ignore:
        targets[b, t] = -100

    params = {n: v.double().requires_grad_(True) for n, v in p32.items()}
    logits = forward(params, cfg, tokens)
    loss = loss_fn(logits, targets, cfg["vocab_size"])
    loss.backward()
    grads = {n: params[n].grad.detach().clone() for n in names}
    with torch.no_grad():
        check_hf_equivalence({n: v.double() for n, v in p32.items()}, cfg, tokens, logits)

    # Same computation in fp32, only to print how much fp32 noise to expect.
    q = {n: v.clone().requires_grad_(True) for n, v in p32.items()}
    l32 = loss_fn(forward(q, cfg, tokens), targets, cfg["vocab_size"])
    l32.backward()
    gdiff = max((q[n].grad.double() - grads[n]).abs().max().item() for n in names)
    print(f"{filename}: loss {loss.item():.8f}; torch fp32 vs fp64: loss diff "
          f"{abs(l32.item() - loss.item()):.2e}, max grad diff {gdiff:.2e}")

    # AdamW on the same batch: decay for 2-D parameters only, as two groups.
    train = {n: v.double().clone().requires_grad_(True) for n, v in p32.items()}
    decay = [train[n] for n in names if train[n].ndim >= 2]
    no_decay = [train[n] for n in names if train[n].ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for step in range(adamw_steps + 1):
        opt.zero_grad()
        l = loss_fn(forward(train, cfg, tokens), targets, cfg["vocab_size"])
        losses.append(l.item())
        if step == adamw_steps:
            break
        l.backward()
        opt.step()
    print(f"  adamw losses: {' '.join(f'{x:.6f}' for x in losses)}")

    out = [(n, p32[n]) for n in names]
    out += [("tokens", tokens), ("targets", targets)]
    out += [("logits", logits.detach().float()), ("loss", loss.detach().float().reshape(1))]
    out += [("grad." + n, grads[n].float()) for n in names]
    out += [("adamw.losses", torch.tensor(losses, dtype=torch.float32))]
    if save_final:
        out += [("adamw." + n, train[n].detach().float()) for n in names]
    meta = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in cfg.items()}
    meta.update({"seed": str(seed), "adamw": "lr=1e-3 betas=(0.9,0.95) eps=1e-8 wd=0.1 (2-D only)",
                 "rotary": "interleaved pairs (2i, 2i+1)",
                 "generator": "tests/reference/gen_llama_tiny.py"})
    path = os.path.join(HERE, filename)
    write_safetensors(path, out, meta)
    print(f"  wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    torch.use_deterministic_algorithms(True)
    base = dict(vocab_size=64, padded_vocab_size=64, max_position_embeddings=32, hidden_size=32,
                intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                tie_word_embeddings=False)
    generate("llama_tiny.safetensors", base, seed=2024, B=2, T=16, save_final=True)
    tied = dict(base, vocab_size=61, num_key_value_heads=4, tie_word_embeddings=True)
    generate("llama_tiny_tied.safetensors", tied, seed=4202, B=2, T=24, ignore=[(1, 3)])


if __name__ == "__main__":
    main()
