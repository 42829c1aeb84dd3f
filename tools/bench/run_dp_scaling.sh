#!/usr/bin/env bash
# Data-parallel weak scaling of the `train` step on CPU ranks: the per-rank micro batch stays
# fixed, so N ranks do N times the work per step. The one-rank run (same threads per rank,
# same launcher) is the reference measured in the same invocation; efficiency =
# tokens/s(N) / (N x tokens/s(1)). Each rank gets `threads` OpenMP threads: N x threads should
# not exceed the cores, or the numbers measure oversubscription, not communication.
#
# usage: tools/bench/run_dp_scaling.sh [build=build] [ranks="1 2"] [stages="0 1 2 3"]
#                                      [threads=1] [steps=12] [model=gpt2-tiny]
# Medians over the steps after the first two (warm-up). Prints a markdown table.
set -euo pipefail
BUILD=${1:-build}; RANKS=${2:-"1 2"}; STAGES=${3:-"0 1 2 3"}; THREADS=${4:-1}; STEPS=${5:-12}
MODEL=${6:-gpt2-tiny}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
TRAIN="$BUILD/bin/train"
[[ -x "$TRAIN" ]] || { echo "run_dp_scaling: $TRAIN not found; build the train target first" >&2; exit 1; }
WORK=$(mktemp -d /tmp/strata_dp_scaling.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# Data: the fortunes byte shards of tools/quickstart.sh if present, else the fortunes text
# tokenized here (the fortunes package is in tools/setup.sh).
DATA="$HERE/datasets/fortunes/train_*.bin"
if ! compgen -G "$DATA" > /dev/null; then
  "$BUILD/bin/tokenize" --tokenizer byte --output "$WORK/data" /usr/share/games/fortunes \
    > /dev/null || { echo "run_dp_scaling: no data; run tools/quickstart.sh first" >&2; exit 1; }
  DATA="$WORK/data/train_*.bin"
fi

MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && MPIRUN+=(--allow-run-as-root)

median_tps() {  # median tokens_per_s of metrics.jsonl lines after the first two
  grep -o '"tokens_per_s":[0-9.e+-]*' "$1" | tail -n +3 | cut -d: -f2 | sort -g |
    awk '{v[NR]=$1} END {if (NR==0) {print 0} else if (NR%2) {print v[(NR+1)/2]} else {print (v[NR/2]+v[NR/2+1])/2}}'
}

echo "| stage | ranks | threads/rank | global batch | tokens/s | tokens/s per rank | efficiency vs 1 rank |"
echo "|---|---|---|---|---|---|---|"
for stage in $STAGES; do
  base=""
  for n in $RANKS; do
    dir="$WORK/run_${stage}_${n}"
    "${MPIRUN[@]}" -np "$n" "$TRAIN" --config "$HERE/configs/default.yaml" \
      --set model.name="$MODEL" --set data.train="$DATA" --set data.val= \
      --set training.eval_every=0 --set training.sample_every=0 \
      --set training.steps="$STEPS" --set training.progress=lines \
      --set schedule.name=constant --set schedule.warmup_steps=0 \
      --set batch.global_batch_size=0 --set batch.grad_accum_steps=1 \
      --set run.threads="$THREADS" --set run.dir="$dir" \
      --set zero_optimization.stage="$stage" > "$dir.log" 2>&1 ||
      { echo "run_dp_scaling: stage $stage x $n ranks failed:" >&2; tail -20 "$dir.log" >&2; exit 1; }
    tps=$(median_tps "$dir/metrics.jsonl")
    gb=$(grep -o 'global batch [0-9]*' "$dir.log" | head -1 | awk '{print $3}')
    [[ -z "$base" ]] && base=$tps
    awk -v s="$stage" -v n="$n" -v t="$THREADS" -v gb="$gb" -v tps="$tps" -v base="$base" \
      'BEGIN {printf "| %s | %s | %s | %s | %.0f | %.0f | %.2f |\n", s, n, t, gb, tps, tps/n, tps/(n*base)}'
  done
done
