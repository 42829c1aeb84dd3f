#!/usr/bin/env bash
# GPT-2 training steps on one GPU: Strata (bench_gpt2_cuda) and, where python3 has torch with
# CUDA, PyTorch eager and torch.compile on the same shapes, in one run on the same GPU, as one
# markdown table. usage: tools/bench/run_gpt2_cuda.sh [build_dir=build] [extra args...]
# (extra args go to both: --dtype bf16|fp32 --peak-tflops X --steps N --models gpt2,gpt2-xl --B n)
set -euo pipefail
BUILD=${1:-build}; shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
"$BUILD/bin/bench_gpt2_cuda" "$@"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  python3 "$HERE/reference/gpt2_cuda.py" "$@"
else
  echo "(python3 with torch+CUDA not found: PyTorch reference skipped)"
fi
