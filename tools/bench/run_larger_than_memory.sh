#!/usr/bin/env bash
# Issue 55's larger-than-memory run: trains configs/zero-infinity-cpu-2.5b.yaml (or CONFIG) with
# its parameters and optimizer states on NVMe and reports what the run took from the machine:
# the model states' size against RAM, the peak resident set (VmHWM) against the allocators'
# view, tokens/s per step, and the bytes the process moved to and from the disk per step
# (/proc/PID/io: block-layer reads and writes, O_DIRECT included) as GB/s, beside bench_nvme's
# store bandwidth on the same directory measured just before.
#
#   tools/bench/run_larger_than_memory.sh [--build DIR] [--nvme DIR] [--config FILE]
#                                         [--skip-bench] [-- train --set options]
#
# Defaults: build, /tmp/strata-nvme (created; its swap files are removed by train at exit), the
# 2.5B config. Run from anywhere; paths are relative to the repository root. Set
# OMP_WAIT_POLICY=passive is done here (the NVMe engine's threads need the cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
NVME=/tmp/strata-nvme
CONFIG=configs/zero-infinity-cpu-2.5b.yaml
BENCH=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --nvme) NVME=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --skip-bench) BENCH=0; shift ;;
    --) shift; break ;;
    *) echo "run_larger_than_memory: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
for b in train tokenize bench_nvme; do
  if [[ ! -x $BUILD/bin/$b ]]; then
    echo "run_larger_than_memory: $BUILD/bin/$b is missing: build it (README) or pass --build" >&2
    exit 2
  fi
done
if ! compgen -G "datasets/fortunes/train_*.bin" >/dev/null; then
  "$BUILD/bin/tokenize" --tokenizer byte --format fortune --output datasets/fortunes \
    /usr/share/games/fortunes
fi
mkdir -p "$NVME"
OUT=$(mktemp -d /tmp/larger-than-memory.XXXXXX)
RUN=$OUT/run
mem_total_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
echo "machine: $(nproc) cores, RAM $(awk -v k="$mem_total_kb" 'BEGIN {printf "%.2f GB", k * 1024 / 1e9}'), free under $NVME: $(df -B1 --output=avail "$NVME" | tail -1 | awk '{printf "%.1f GB", $1 / 1e9}'), load $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ $BENCH == 1 ]]; then
  echo "== bench_nvme --dir $NVME --size-mib 1024 --reps 3 (the store's bandwidth on this disk)"
  "$BUILD/bin/bench_nvme" --dir "$NVME" --size-mib 1024 --reps 3 --fio-hugetlbfs off 2>&1 |
    tee "$OUT/bench_nvme.txt" | grep -E '^\| (op|write|read) ' || true
fi

echo "== train --config $CONFIG (run dir $RUN, log $OUT/train.log)"
# Each output line is stamped with the time it arrived (seconds since the epoch), so a step's
# line marks when that step ended.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }
OMP_WAIT_POLICY=passive "$BUILD/bin/train" --config "$CONFIG" --set "run.dir=$RUN" \
  --set "zero_optimization.offload_param.nvme_path=$NVME" \
  --set "zero_optimization.offload_optimizer.nvme_path=$NVME" "$@" \
  > >(stamp >"$OUT/train.log") 2>&1 &
PID=$!
# One line a second: the time, VmRSS and VmHWM (kB), read_bytes and write_bytes.
while kill -0 "$PID" 2>/dev/null; do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo 0)
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo 0)
  io=$(awk '/^read_bytes|^write_bytes/ {printf "%s ", $2}' "/proc/$PID/io" 2>/dev/null || echo "0 0")
  echo "$(date +%s.%N) ${rss:-0} ${hwm:-0} $io" >>"$OUT/samples.txt"
  sleep 1
done
status=0
wait "$PID" || status=$?
sleep 1  # the stamping reader drains
cut -d' ' -f2- "$OUT/train.log"
echo "== train exit status $status; samples (s, RSS kB, peak RSS kB, read B, written B) in $OUT/samples.txt"
awk -v ram_kb="$mem_total_kb" '
  NR == 1 { t0 = $1 }
  { if ($3 > peak) peak = $3; last_t = $1 - t0; r = $4; w = $5 }
  END { printf "peak RSS %.2f GB (%.0f%% of RAM); disk read %.1f GB, written %.1f GB in %.0f s\n",
        peak * 1024 / 1e9, 100 * peak / ram_kb, r / 1e9, w / 1e9, last_t }' "$OUT/samples.txt"
if [[ -f $RUN/metrics.jsonl ]]; then
  # Per step: its seconds from metrics.jsonl, its end from the time its log line arrived, and
  # the bytes the process moved between its start and end (the nearest samples).
  python3 - "$RUN/metrics.jsonl" "$OUT/samples.txt" "$OUT/train.log" <<'PY'
import json, re, sys
steps = {}
for l in open(sys.argv[1]):
    s = json.loads(l)
    steps[s["step"]] = s
samples = [list(map(float, l.split())) for l in open(sys.argv[2]) if len(l.split()) == 5]
ends = {}
for l in open(sys.argv[3]):
    m = re.match(r"(\S+) step (\d+)/\d+ \|", l)
    if m:
        ends[int(m.group(2))] = float(m.group(1))
def at(ts):
    return min(samples, key=lambda x: abs(x[0] - ts))
for k in sorted(steps):
    s = steps[k]
    if k not in ends:
        continue
    a, b = at(ends[k] - s["step_s"]), at(ends[k])
    rd, wr = (b[3] - a[3]) / 1e9, (b[4] - a[4]) / 1e9
    dt = max(b[0] - a[0], 1e-9)
    print(f"step {k}: loss {s['loss']:.4f}, {s['step_s']:.1f} s, {s['tokens_per_s']:.1f} tok/s, "
          f"param wait {s.get('param_wait_ms', 0) / 1e3:.1f} s; disk read {rd:.1f} GB + written "
          f"{wr:.1f} GB in {dt:.0f} s = {(rd + wr) / dt:.2f} GB/s")
# A step's writes finish behind the next step's compute, so the steps together say more.
done = [k for k in sorted(steps) if k in ends]
if done:
    a, b = at(ends[done[0]] - steps[done[0]]["step_s"]), at(ends[done[-1]])
    rd, wr = (b[3] - a[3]) / 1e9, (b[4] - a[4]) / 1e9
    dt = max(b[0] - a[0], 1e-9)
    toks = sum(steps[k]["tokens_per_s"] * steps[k]["step_s"] for k in done)
    print(f"steps {done[0]}-{done[-1]}: {toks / dt:.1f} tok/s; disk read {rd:.1f} GB + written "
          f"{wr:.1f} GB in {dt:.0f} s: read {rd / dt:.2f} GB/s, write {wr / dt:.2f} GB/s, "
          f"together {(rd + wr) / dt:.2f} GB/s")
PY
fi
exit "$status"
