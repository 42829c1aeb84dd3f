#!/usr/bin/env python3
"""PyTorch reference for bench_gpt2_cuda: the same GPT-2 shapes and step (forward + backward, no
optimizer), eager and with torch.compile, on the same GPU. Prints markdown rows with the same
columns. Run only where python3 has torch with CUDA (the GPU machine); never part of the product.

usage: gpt2_cuda.py [--dtype bf16|fp32] [--peak-tflops X] [--steps N] [--models a,b] [--B n]
"""
import argparse
import time

import torch
import torch.nn.functional as F

CONFIGS = [("gpt2", 12, 768, 12, 16), ("gpt2-medium", 24, 1024, 16, 8),
           ("gpt2-large", 36, 1280, 20, 4), ("gpt2-xl", 48, 1600, 25, 2)]
V = 50304


class Block(torch.nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = torch.nn.LayerNorm(c)
        self.c_attn = torch.nn.Linear(c, 3 * c)
        self.c_proj = torch.nn.Linear(c, c)
        self.ln_2 = torch.nn.LayerNorm(c)
        self.c_fc = torch.nn.Linear(c, 4 * c)
        self.mlp_proj = torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, n_layer, c, h, t):
        super().__init__()
        self.wte = torch.nn.Embedding(V, c)
        self.wpe = torch.nn.Embedding(t, c)
        self.blocks = torch.nn.ModuleList(Block(c, h) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(c)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def run(model, idx, tg, dtype, steps):
    times, loss = [], 0.0
    for s in range(steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(idx, tg)
        loss.backward()
        loss = loss.item()
        if s > 0:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--models", default="")
    p.add_argument("--B", type=int, default=0)
    p.add_argument("--T", type=int, default=1024)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.dtype != "fp32"
    for name, n_layer, c, h, batch in CONFIGS:
        if a.models and name not in a.models:
            continue
        batch = a.B or batch
        t = a.T
        n = n_layer * 12 * c * c + V * c
        torch.manual_seed(1)
        idx = torch.randint(0, 50257, (batch, t), device="cuda")
        tg = torch.randint(0, 50257, (batch, t), device="cuda")
        for mode in ("eager", "compile"):
            model = GPT(n_layer, c, h, t).cuda()
            m = torch.compile(model) if mode == "compile" else model
            step_s, loss = run(m, idx, tg, a.dtype, a.steps)
            flops = (6 * n + 12 * n_layer * t * c) * batch * t / step_s
            print(f"| {name} (torch {mode}) | {n / 1e6:.0f}M | {batch} | {t} | {a.dtype} | "
                  f"{step_s:.3f} | {batch * t / step_s:.0f} | {flops / 1e12:.1f} | "
                  f"{100 * flops / 1e12 / a.peak_tflops:.1f}% | {loss:.4f} |", flush=True)
            del model, m
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
