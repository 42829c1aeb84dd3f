"""PyTorch reference for bench_gpt2_cpu: GPT-2 forward + backward time on the CPU, same shapes.

Run only where python3 has torch (never inside the product). Prints one markdown row.
usage: python3 gpt2_cpu.py [model=gpt2] [B=1] [T=256] [steps=3]
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # n_layer, n_head, n_embd
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
}


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab=50304, block=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits[..., :50257].reshape(-1, 50257), targets.reshape(-1))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
    B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    T = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    torch.manual_seed(0)
    model = GPT(*SHAPES[name])
    idx = torch.randint(0, 50257, (B, T))
    tgt = torch.randint(0, 50257, (B, T))
    times = []
    for s in range(steps + 1):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        loss = model(idx, tgt)
        loss.backward()
        if s > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    dt = times[len(times) // 2]
    print(f"| pytorch {torch.__version__} | {name} | {B} | {T} | {torch.get_num_threads()} | "
          f"{dt:.3f} | {B * T / dt:.1f} |")


if __name__ == "__main__":
    main()
