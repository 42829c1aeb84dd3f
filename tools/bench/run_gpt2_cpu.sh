#!/usr/bin/env bash
# GPT-2 CPU forward+backward: Strata and, where python3 has torch, PyTorch on the same shapes,
# in one run. usage: tools/bench/run_gpt2_cpu.sh [build_dir=build] [model=gpt2] [B=1] [T=256] [steps=3]
set -euo pipefail
BUILD=${1:-build}; MODEL=${2:-gpt2}; B=${3:-1}; T=${4:-256}; STEPS=${5:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$("$BUILD/bin/bench_gpt2_cpu" "$MODEL" "$B" "$T" "$STEPS")
echo "$OUT"
if python3 -c "import torch" 2>/dev/null; then
  REF=$(python3 "$HERE/reference/gpt2_cpu.py" "$MODEL" "$B" "$T" "$STEPS")
  echo
  echo "| reference | model | B | T | threads | step s | tokens/s |"
  echo "|---|---|---|---|---|---|---|"
  echo "$REF"
  ours=$(echo "$OUT" | tail -1 | awk -F'|' '{print $8}')
  theirs=$(echo "$REF" | awk -F'|' '{print $8}')
  python3 -c "print(f'\nStrata / PyTorch tokens/s: {float(\"$ours\")/float(\"$theirs\"):.2f}')"
else
  echo "(python3 with torch not found: PyTorch reference skipped)"
fi
