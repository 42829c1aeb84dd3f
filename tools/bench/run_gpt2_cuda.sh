#!/usr/bin/env bash
# GPT-2 training steps on one GPU, Strata against PyTorch in one run on the same GPU:
# bench_gpt2_cuda (the step `train` runs there: registry model, Engine, bf16 mixed precision,
# fused AdamW, grad clipping), then, where python3 has torch with CUDA, reference/gpt2_cuda.py
# eager and with torch.compile at the B Strata used for each model. Prints the device and date,
# one table of every row, and one table per model with tokens/s and the ratios
# Strata / torch.compile and Strata / eager.
# usage: tools/bench/run_gpt2_cuda.sh [build_dir=build] [bench args...]
#   e.g. tools/bench/run_gpt2_cuda.sh build-gpu --fill
# Bench args (both programs take them): --dtype bf16|fp32 --models a,b --B n --fill --T n
# --warmup n --steps n --peak-tflops X --seed n --profile n (Strata: a per-op device-time table;
# PyTorch: torch.profiler's kernel table) --tf32 (with --dtype fp32: fp32 matmuls on TF32 on both
# sides). The reference gets --models and --B per model.
set -euo pipefail
BUILD=${1:-build}; shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
STRATA=$(mktemp); TORCH=$(mktemp)
trap 'rm -f "$STRATA" "$TORCH"' EXIT

echo "# GPT-2 training step on one GPU: Strata vs PyTorch"
echo
DEVICE=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>/dev/null | head -1 || true)
echo "- device: ${DEVICE:-unknown (nvidia-smi not found)}"
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "- args: ${*:-(defaults)}"
echo
"$BUILD/bin/bench_gpt2_cuda" "$@" | tee "$STRATA"

ON_CPU=0
prev=""
for arg in "$@"; do
  [[ $arg == --device=cpu || ( $prev == --device && $arg == cpu ) ]] && ON_CPU=1
  prev=$arg
done
# --device cpu is a smoke run of both programs and of the tables below where there is no GPU
# (gpt2_cuda.py takes --device cpu too); Strata's CPU benchmark is run_gpt2_cpu.sh.
if python3 -c "import torch, sys; sys.exit(0 if $ON_CPU or torch.cuda.is_available() else 1)" \
    2>/dev/null; then
  # MFU against the peak Strata used (its "- peaks: X TFLOP/s" line; Note [GPU peaks]), unless
  # the args give --peak-tflops, which come later and win.
  PEAK=$(awk '/^- peaks: / { print "--peak-tflops", $3; exit }' "$STRATA")
  # Columns: | impl | model | params | B | T | dtype | tokens/s | ...
  awk -F'|' '$2 ~ /strata/ { gsub(/ /, "", $3); gsub(/ /, "", $5); print $3, $5 }' "$STRATA" |
    while read -r model batch; do
      python3 "$HERE/reference/gpt2_cuda.py" $PEAK "$@" --models "$model" --B "$batch" --no-header \
        </dev/null | tee -a "$TORCH" ||
        echo "| torch | $model | - | $batch | - | - | failed (see stderr) | - | - | - | - |"
    done
elif [[ $ON_CPU == 1 ]]; then
  echo
  echo "(python3 with torch not found: PyTorch reference skipped)"
else
  echo
  echo "(python3 with torch+CUDA not found: PyTorch reference skipped)"
fi

echo
awk -F'|' '
  function trim(s) { gsub(/^ +| +$/, "", s); return s }
  function dash(s) { return s == "" ? "-" : s }
  function ratio(a, b) { return (a + 0 > 0 && b + 0 > 0) ? sprintf("%.2fx", a / b) : "-" }
  {
    impl = trim($2); m = trim($3)
    if (m == "" || m == "model" || m ~ /^-+$/) next
    # "strata-unfused" (STRATA_FUSED_OPS=off) is Strata too; its model cell says so.
    if (impl ~ /^strata/) { label[m] = impl == "strata" ? m : m " (" impl ")"; impl = "strata" }
    tok[impl, m] = trim($8); mfu[impl, m] = trim($10); bat[impl, m] = trim($5)
    if (impl == "strata") { order[++n] = m; batch[m] = trim($5); dtype[m] = trim($7) }
  }
  END {
    print "| model | B | dtype | Strata tokens/s | eager tokens/s | compile tokens/s | " \
          "Strata / eager | Strata / compile | Strata MFU | compile MFU |"
    print "|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= n; ++i) {
      m = order[i]; s = tok["strata", m]; e = tok["torch eager", m]; c = tok["torch compile", m]
      # PyTorch at a smaller B (it ran out of memory at Strata'"'"'s, reference --fill): say which.
      if (bat["torch eager", m] != "" && bat["torch eager", m] != batch[m] && e + 0 > 0)
        e = e " (B " bat["torch eager", m] ")"
      if (bat["torch compile", m] != "" && bat["torch compile", m] != batch[m] && c + 0 > 0)
        c = c " (B " bat["torch compile", m] ")"
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label[m], batch[m], dtype[m], s,
             dash(e), dash(c), ratio(s, e), ratio(s, c), mfu["strata", m],
             dash(mfu["torch compile", m])
    }
  }' "$STRATA" "$TORCH"
