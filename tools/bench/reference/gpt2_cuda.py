#!/usr/bin/env python3
"""PyTorch reference for bench_gpt2_cuda: the same GPT-2 training step on the same GPU, eager and
with torch.compile, printed as markdown rows with the same columns (impl "torch eager" / "torch
compile"). Run only where python3 has torch with CUDA (the GPU machine); never in CI, never part
of the product. tools/bench/run_gpt2_cuda.sh runs it per model with the B Strata used.

The step is PyTorch's usual one: fp32 parameters, the forward under torch.autocast(bfloat16) with
--dtype bf16 (plain fp32 with --dtype fp32), the LM head tied to wte over the padded vocabulary
50304 and the cross entropy over the first 50257 logits (Strata's Note [Padded vocabulary]),
backward, loss.item() (after the backward, where Strata's step reads it), clip_grad_norm_(1.0),
torch.optim.AdamW(fused=True) with lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
matrices and embeddings and 0 on biases and norm weights (as Strata's segments), zero_grad. No
TF32, since Strata's GEMMs accumulate in fp32 without it, unless --tf32 (with --dtype fp32, as
bench_gpt2_cuda --tf32: torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32; the dtype
column then says fp32+tf32). Ids and targets (random with a fixed
seed; targets are the ids shifted by one) are copied from the host every step, as `train` does.
--warmup untimed steps (with torch.compile they include the compilation), then --steps steps, each
ended by torch.cuda.synchronize(); the median is reported. MFU uses Strata's count, training_flops_per_token (Note [MFU] in
runtime/trainer.h); peak GPU memory is torch.cuda.max_memory_allocated over the timed steps.

usage: gpt2_cuda.py [--dtype bf16|fp32] [--models a,b] [--B n] [--T n] [--warmup n] [--steps n]
                    [--peak-tflops X] [--modes eager,compile] [--seed n] [--device cuda|cpu]
                    [--tf32]
(--recompute-gelu is accepted and ignored, so run_gpt2_cuda.sh can pass bench_gpt2_cuda's
arguments to both. --fill: where PyTorch runs out of memory at --B, B is halved until it fits, so
each side is timed at its own largest power-of-two B.)

--device cpu runs the same step on the CPU (autocast to bfloat16 there with --dtype bf16; no peak
memory). It is a smoke run, for checking this script and run_gpt2_cuda.sh's tables where torch has
no GPU (run_gpt2_cuda.sh --device cpu passes it), not a benchmark: Strata's CPU reference is
gpt2_cpu.py.
"""
import argparse
import gc
import math
import statistics
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F

VOCAB, PADDED_VOCAB, N_POSITIONS = 50257, 50304, 1024
# name: (n_layer, n_embd, n_head, default B) -- the registry's presets and bench_gpt2_cuda's B.
CONFIGS = {"gpt2": (12, 768, 12, 16), "gpt2-medium": (24, 1024, 16, 8),
           "gpt2-large": (36, 1280, 20, 4), "gpt2-xl": (48, 1600, 25, 2)}


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
    def __init__(self, n_layer, c, h):
        super().__init__()
        self.wte = torch.nn.Embedding(PADDED_VOCAB, c)
        self.wpe = torch.nn.Embedding(N_POSITIONS, c)
        self.blocks = torch.nn.ModuleList(Block(c, h) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(c)
        # GPT-2's init, as Strata's: N(0, 0.02), residual projections 0.02 / sqrt(2 n_layer).
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
            torch.nn.init.normal_(p, 0.0, std)
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.wte.weight[VOCAB:].zero_()

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)[..., :VOCAB]
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def training_flops_per_token(n_params, n_layer, c, t):
    """runtime/trainer.cpp: 6 per matmul parameter (all but wpe) + 12 L T C for attention."""
    return 6.0 * (n_params - N_POSITIONS * c) + 12.0 * n_layer * t * c


def random_tokens(batch, t, seed):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, VOCAB, (batch, t + 1), generator=g, dtype=torch.int64)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def measure(name, mode, batch, a):
    n_layer, c, h, _ = CONFIGS[name]
    torch.manual_seed(a.seed)
    model = GPT(n_layer, c, h).to(a.device)
    n_params = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x_host, y_host = random_tokens(batch, a.T, a.seed)

    def step():
        x, y = x_host.to(a.device), y_host.to(a.device)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = fwd(x, y)
        loss.backward()
        value = loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return value

    on_gpu = a.device == "cuda"
    for _ in range(a.warmup):
        step()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], 0.0
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens_s = batch * a.T / step_s
    mfu = training_flops_per_token(n_params, n_layer, c, a.T) * tokens_s / (a.peak_tflops * 1e12)
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if on_gpu else "-"
    row = (f"| torch {mode} | {name} | {n_params / 1e6:.0f}M | {batch} | {a.T} | {dtype_label(a)} | "
           f"{tokens_s:.0f} | {step_s * 1e3:.1f} | {100 * mfu:.1f}% | {peak} | {loss:.4f} |")
    return row, profile_table(step, f"torch {mode} {name} at B = {batch}", a.profile, on_gpu)


def profile_table(step, what, steps, on_gpu):
    """--profile N (as bench_gpt2_cuda's): N more steps under torch.profiler, and its table of
    kernels by self device time, to set beside Strata's per-op table. No '|' in it, so
    run_gpt2_cuda.sh's summary skips it."""
    if steps <= 0:
        return ""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=30)
    return f"\nTime per kernel, {what}: {steps} profiled steps (totals)\n\n```\n{table}\n```\n"


def dtype_label(a):
    """The dtype column: --dtype, or fp32+tf32 (bench_gpt2_cuda's)."""
    return "fp32+tf32" if a.tf32 else a.dtype


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--models", default=",".join(CONFIGS))
    p.add_argument("--B", type=int, default=0, help="micro-batch (default: bench_gpt2_cuda's)")
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="dense peak for MFU (run_gpt2_cuda.sh passes the one Strata used: the "
                        "device's datasheet peak, Note [GPU peaks] in runtime/device_peaks.h)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--fill", action="store_true",
                   help="run_gpt2_cuda.sh passes the B Strata's --fill found as --B; where PyTorch "
                        "runs out of memory at it, halve B until it fits")
    p.add_argument("--no-header", action="store_true", help="rows only (run_gpt2_cuda.sh)")
    p.add_argument("--profile", type=int, default=0,
                   help="after the timed steps, N more under torch.profiler; prints its kernel "
                        "table (by self device time) after each row")
    # bench_gpt2_cuda's other flags, which run_gpt2_cuda.sh passes to both programs.
    p.add_argument("--peak-gbps", type=float, default=0.0,
                   help="ignored: the bandwidth of Strata's roofline bound in its --profile table")
    p.add_argument("--recompute-gelu", action="store_true",
                   help="ignored: Strata's GELU recompute; PyTorch's step keeps its usual tensors")
    p.add_argument("--matmul-tune", action="store_true",
                   help="ignored: Strata's cuBLASLt algorithm tuning; PyTorch runs its defaults")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run of this script without a GPU, not a benchmark")
    p.add_argument("--tf32", action="store_true",
                   help="with --dtype fp32: fp32 matmuls on TF32 (allow_tf32), as Strata's --tf32")
    a = p.parse_args()
    if a.tf32 and a.dtype != "fp32":
        raise SystemExit(f"--tf32 changes fp32 matmuls only; add --dtype fp32 (not {a.dtype})")
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    if not a.no_header:
        print("| impl | model | params | B | T | dtype | tokens/s | step ms | MFU | peak GPU mem | "
              "loss |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"unknown model '{name}'; known: {', '.join(CONFIGS)}")
        for mode in a.modes.split(","):
            # With --fill (run_gpt2_cuda.sh passes Strata's filled B as --B), a B that PyTorch
            # cannot fit is halved until it fits: each is then timed at its own largest
            # power-of-two B, and the row's B column says which. Without --fill an OOM is the row.
            batch = a.B or CONFIGS[name][3]
            while True:
                table = ""
                try:
                    row, table = measure(name, mode, batch, a)
                except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or inductor's wrapper
                    if "out of memory" not in str(e).lower():
                        raise
                    row = (f"| torch {mode} | {name} | - | {batch} | {a.T} | {dtype_label(a)} "
                           "| OOM | - | - | - | - |")
                    if a.fill and batch > 1:
                        print(f"torch {mode} {name}: B = {batch} does not fit; trying {batch // 2}",
                              file=sys.stderr, flush=True)
                        batch //= 2
                        row = None
                finally:
                    gc.collect()
                    torch._dynamo.reset()
                    if a.device == "cuda":
                        torch.cuda.empty_cache()
                if row is not None:
                    break
            print(row, flush=True)
            if table:
                print(table, flush=True)


if __name__ == "__main__":
    main()
