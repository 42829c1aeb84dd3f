#!/usr/bin/env python3
"""Reference values for tests/models/gpt2_reference_test.cpp, made with plain PyTorch.

A tiny GPT-2 written out by hand, mirroring HF's GPT2LMHeadModel: pre-LN blocks, fused c_attn
projection split into q, k, v, causal softmax attention with 1/sqrt(head_dim) scaling, GELU (tanh
approximation), LayerNorm eps 1e-5, LM head tied to wte. Parameter names are Strata's (HF GPT-2
without the "transformer." prefix) and Linear weights are stored [out, in] as Strata keeps them
(HF's Conv1D stores [in, out]).

Weights are drawn in fp32 with torch.manual_seed; the forward, backward and AdamW steps then run in
float64 so that the stored values (rounded to fp32) carry no fp32 accumulation noise of their own:
the C++ test's differences are Strata's error alone. No dropout (p = 0).

Files written next to this script (safetensors written by hand: 8-byte little-endian header
length, JSON header, raw little-endian data):
  gpt2_tiny.safetensors         vocab 64 (= padded vocab); also the parameters after 10 AdamW steps
  gpt2_tiny_padded.safetensors  vocab 61 padded to 64, one target = -100 (ignore_index)
Each holds: the weights (by parameter name), "tokens" and "targets" (i64 [B, T]), "logits"
([B, T, padded_vocab]), "loss" ([1]), "grad.<name>" for every parameter, and "adamw.losses"
([11]: the loss before each of 10 AdamW steps and after the last). AdamW: lr 1e-3, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D parameters only (two param groups). The config
is in the header's __metadata__.

Run: python3 tests/reference/gen_gpt2_tiny.py   (a few seconds on CPU; torch only)
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def make_params(cfg, seed):
    """fp32 weights in Strata's names and layouts. Scales are larger than GPT-2's init (and
    LayerNorm affines are not 1/0) so every term of the computation matters to the outputs."""
    torch.manual_seed(seed)
    C, L = cfg["n_embd"], cfg["n_layer"]
    V, Vp, P = cfg["vocab_size"], cfg["padded_vocab_size"], cfg["n_positions"]
    p = {}

    def normal(*shape, std):
        return torch.randn(*shape, dtype=torch.float32) * std

    wte = normal(Vp, C, std=0.1)
    wte[V:] = 0.0  # padded rows start at zero (Note [Padded vocabulary])
    p["wte.weight"] = wte
    p["wpe.weight"] = normal(P, C, std=0.05)
    for i in range(L):
        h = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            p[h + ln + ".weight"] = 1.0 + normal(C, std=0.1)
            p[h + ln + ".bias"] = normal(C, std=0.05)
        p[h + "attn.c_attn.weight"] = normal(3 * C, C, std=0.15)
        p[h + "attn.c_attn.bias"] = normal(3 * C, std=0.05)
        p[h + "attn.c_proj.weight"] = normal(C, C, std=0.1)
        p[h + "attn.c_proj.bias"] = normal(C, std=0.05)
        p[h + "mlp.c_fc.weight"] = normal(4 * C, C, std=0.1)
        p[h + "mlp.c_fc.bias"] = normal(4 * C, std=0.05)
        p[h + "mlp.c_proj.weight"] = normal(C, 4 * C, std=0.1)
        p[h + "mlp.c_proj.bias"] = normal(C, std=0.05)
    p["ln_f.weight"] = 1.0 + normal(C, std=0.1)
    p["ln_f.bias"] = normal(C, std=0.05)
    return p


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward(p, cfg, ids):
    B, T = ids.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg["layer_norm_epsilon"]
    x = p["wte.weight"][ids] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"])
        x = x + (m @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T  # tied head: [B, T, padded_vocab]


def loss_fn(logits, targets, vocab_size):
    # Only the real vocabulary takes part in the loss (Note [Padded vocabulary]).
    V = vocab_size
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1), ignore_index=-100)


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
                 "generator": "tests/reference/gen_gpt2_tiny.py"})
    path = os.path.join(HERE, filename)
    write_safetensors(path, out, meta)
    print(f"  wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    torch.use_deterministic_algorithms(True)
    base = dict(vocab_size=64, padded_vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                n_head=4, layer_norm_epsilon=1e-5)
    generate("gpt2_tiny.safetensors", base, seed=1234, B=2, T=16, save_final=True)
    padded = dict(base, vocab_size=61)
    generate("gpt2_tiny_padded.safetensors", padded, seed=4321, B=2, T=24, ignore=[(1, 3)])


if __name__ == "__main__":
    main()
