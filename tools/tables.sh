#!/usr/bin/env bash
# The measured table of issue 56 (docs/tables.md): on the machine it runs on, the largest
# GPT-2-shaped model that trains a few steps under each placement that exists here, found by
# training probes, with tokens/s, beside `estimate --table strategies --device cpu`'s prediction
# for the same machine (Note [CPU placement model] in parallel/cpu_capacity.h).
#
# The family: GPT-2 of hidden size --hidden (2048: ZeRO-Offload's 1B and 2B models, Table 3 of
# arXiv:2101.06840, have 20 and 40 blocks of 2048), --heads, --vocab, --seq fixed; the number of
# blocks varies, so the models grow monotonically, one block (12·hd² + 13·hd parameters) a step.
# The search starts at the predicted largest member, steps up or down (doubling) until it has a
# success and a failure, then bisects between the largest success and the smallest failure. A
# probe is one `train` run of --steps steps in a temporary directory; a model too large fails
# at start (the host-memory plan, run.host_memory_budget; the NVMe store's reservation), and a
# probe that fails, is killed or times out is a failure row with its reason.
#
# usage: tools/tables.sh <build dir> [--data GLOB] [--nvme-dir DIR] [--nvme-cap SIZE]
#          [--host-mem SIZE] [--hidden N] [--heads N] [--vocab N] [--seq N] [--steps N]
#          [--max-layers N] [--timeout S] [--placements memory,offload,cpu,nvme]
#          [--out FILE] [--dry-run]
#   --placements     which rows (default all four); offload is skipped with its reason (the
#                    probes train on run.device cpu)
#   --nvme-cap SIZE  treat SIZE as the whole disk: a filesystem of SIZE is made in a file under
#                    --nvme-dir and loop-mounted for the NVMe probes (needs root); estimate is
#                    given the free bytes it has
#   --host-mem SIZE  run.host_memory_budget of every probe and estimate's --cpu-mem (default:
#                    auto, what the machine has free, as train's default)
#   --dry-run        print the prediction and the probes the search starts with; train nothing
set -euo pipefail

usage() { awk '/^# usage:/ { p = 1 } p && !/^#/ { exit } p { sub(/^# ?/, ""); print }' "$0" >&2; exit 2; }
build=${1:-}
[[ -z "$build" || "$build" == -* ]] && usage
shift
# Paths given are relative to where the script is run; the default data is the README's, in the
# repository this script belongs to.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data="$root/datasets/fortunes/train_*.bin"
nvme_dir=/tmp
nvme_cap=""
host_mem=""
hidden=2048 heads=16 vocab=256 seq=128 steps=2 max_layers=64 timeout_s=1800
placements=memory,offload,cpu,nvme
out=""
dry=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --nvme-dir) nvme_dir=$2; shift 2 ;;
    --nvme-cap) nvme_cap=$2; shift 2 ;;
    --host-mem) host_mem=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --max-layers) max_layers=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --placements) placements=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) echo "tables.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
for n in hidden heads vocab seq steps max_layers timeout_s; do
  [[ "${!n}" =~ ^[1-9][0-9]*$ ]] || { echo "tables.sh: --${n//_/-} '${!n}' is not a count of 1 or more" >&2; exit 2; }
done
for p in ${placements//,/ }; do
  [[ "$p" =~ ^(memory|offload|cpu|nvme)$ ]] ||
    { echo "tables.sh: --placements: '$p' is not memory, offload, cpu or nvme" >&2; exit 2; }
done
train="$build/bin/train" estimate="$build/bin/estimate"
for b in "$train" "$estimate"; do
  [[ -x "$b" ]] || { echo "tables.sh: $b not found; build it first (README: ninja -C $build train estimate)" >&2; exit 2; }
done
[[ -d "$nvme_dir" ]] || { echo "tables.sh: --nvme-dir '$nvme_dir' is not a directory" >&2; exit 2; }
compgen -G "$data" > /dev/null ||
  { echo "tables.sh: no training data matches --data '$data'; tokenize some as the README shows (build/bin/tokenize ... --output datasets/fortunes)" >&2; exit 2; }
say() { echo "tables: $*" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/strata-tables.XXXXXX")
mnt=""
made_swap=0
cleanup() {
  if [[ -n "$mnt" ]] && mountpoint -q "$mnt"; then umount "$mnt" || say "could not unmount $mnt"; fi
  rm -rf "$work"
  [[ $made_swap -eq 1 ]] && rm -rf "$swap_dir"
  [[ -n "${cap_img:-}" ]] && rm -f "$cap_img"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The NVMe directory the probes swap to: --nvme-dir, or a filesystem of --nvme-cap bytes in it.
swap_dir="$nvme_dir/strata-tables-swap.$$"
if [[ -n "$nvme_cap" && $dry -eq 0 && ",$placements," == *,nvme,* ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "tables.sh: --nvme-cap loop-mounts a filesystem of that size and needs root; run without it to use the whole of --nvme-dir" >&2; exit 2; }
  for tool in truncate mkfs.ext4 mount umount mountpoint; do
    command -v "$tool" > /dev/null || { echo "tables.sh: --nvme-cap needs $tool (e2fsprogs, util-linux)" >&2; exit 2; }
  done
  cap_img="$nvme_dir/strata-tables-disk.$$.img"
  truncate -s "$nvme_cap" "$cap_img"
  mkfs.ext4 -q -m 0 -F "$cap_img"
  mnt="$work/disk"
  mkdir -p "$mnt"
  mount -o loop "$cap_img" "$mnt"
  swap_dir="$mnt/swap"
fi
if [[ $dry -eq 1 ]]; then
  nvme_size=${nvme_cap:-$(df -B1 --output=avail "$nvme_dir" | tail -1 | tr -d ' ')B}
else
  mkdir -p "$swap_dir"
  made_swap=1
  nvme_free=$(df -B1 --output=avail "$swap_dir" | tail -1 | tr -d ' ')
  nvme_size="${nvme_free}B"
fi

# The prediction for this machine (Note [CPU placement model]).
est_args=(--table strategies --device cpu --hidden "$hidden" --heads "$heads" --vocab "$vocab"
  --seq "$seq" --micro-batch 1 --max-layers "$max_layers" --nvme "$nvme_size")
[[ -n "$host_mem" ]] && est_args+=(--cpu-mem "$host_mem")
prediction=$("$estimate" "${est_args[@]}")
echo "$prediction"
echo
predicted() {  # predicted() NAME -> "layers params"
  echo "$prediction" | awk -v name="$1" '/^  placement/ { rows = 1; next } rows && /^$/ { exit }
    rows && substr($0, 3, 16) ~ "^" name " *$" { n = split(substr($0, 19), f, " "); print f[1], f[2]; exit }'
}

params_of() {  # Ψ of a family member: L·(12hd² + 13hd) + (padded vocab + seq)·hd + 2hd (ln_f)
  local l=$1 pv=$(( (vocab + 63) / 64 * 64 ))
  awk -v l="$l" -v h="$hidden" -v v="$pv" -v s="$seq" \
    'BEGIN { printf "%.2fM", (l * (12 * h * h + 13 * h) + (v + s) * h + 2 * h) / 1e6 }'
}

placement_name() { case $1 in memory) echo "in memory" ;; offload) echo "ZeRO-Offload" ;;
  cpu) echo "ZeRO-Inf-CPU" ;; nvme) echo "ZeRO-Inf-NVMe" ;; esac; }

write_config() {  # write_config PLACEMENT LAYERS FILE
  local p=$1 l=$2 f=$3
  cat > "$f" <<EOF
run:
  dir: $work/run
  device: cpu
  dtype: fp32
  host_memory_budget: ${host_mem:-auto}
model:
  name: gpt2-tiny
  config:
    vocab_size: $vocab
    n_layer: $l
    n_embd: $hidden
    n_head: $heads
    n_positions: $seq
data:
  train: $data
batch:
  micro_batch_size: 1
  seq_len: $seq
training:
  steps: $steps
  log_every: 1
  checkpoint_every: 0
  final_checkpoint: false
  resume: never
  progress: lines
schedule:
  name: constant
  warmup_steps: 0
EOF
  case $p in
    memory) printf 'zero_optimization:\n  stage: 0\n' >> "$f" ;;
    cpu) printf 'zero_optimization:\n  stage: 3\n  offload_param:\n    device: cpu\n' >> "$f" ;;
    nvme) printf 'zero_optimization:\n  stage: 3\n  offload_param:\n    device: nvme\n    nvme_path: %s\n  offload_optimizer:\n    device: nvme\n    nvme_path: %s\n' "$swap_dir" "$swap_dir" >> "$f" ;;
  esac
}

# probe PLACEMENT LAYERS: trains; sets probe_ok (1/0), probe_tps, probe_reason, probe_s.
declare -A done_ok done_tps done_reason
runs=()
probe() {
  local p=$1 l=$2 cfg="$work/$1-$2.yaml" log="$work/$1-$2.log" rc=0 t0 t1
  write_config "$p" "$l" "$cfg"
  rm -rf "$work/run"
  say "$(placement_name "$p"): $l layers ($(params_of "$l") parameters) ..."
  t0=$(date +%s)
  OMP_WAIT_POLICY=passive timeout -k 30 "$timeout_s" "$train" --config "$cfg" > "$log" 2>&1 || rc=$?
  t1=$(date +%s)
  probe_s=$((t1 - t0)) probe_ok=0 probe_tps="-" probe_reason=""
  local metrics="$work/run/metrics.jsonl" lines=0
  [[ -f "$metrics" ]] && lines=$(grep -c '"step"' "$metrics" || true)
  if [[ $rc -eq 0 && $lines -ge $steps ]]; then
    probe_ok=1
    probe_tps=$(tail -1 "$metrics" | sed -n 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/p' | awk '{ printf "%.1f", $1 }')
    probe_reason="trained $steps steps"
  elif [[ $rc -eq 124 ]]; then
    probe_reason="timed out after --timeout ${timeout_s} s"
  elif [[ $rc -eq 137 ]]; then
    probe_reason="killed (status 137: the kernel's OOM killer, or still running 30 s after --timeout)"
  elif [[ $rc -eq 0 ]]; then
    probe_reason="exited 0 after $lines of $steps steps"
  else
    # The error without the tool's and the config file's names.
    probe_reason=$(grep -m1 'error:' "$log" | sed -e 's/^[^:]*: error: //' -e 's/^[^ ]*\.yaml[:0-9]*: //' | cut -c1-150)
    [[ -z "$probe_reason" ]] && probe_reason="exit status $rc: $(tail -1 "$log" | cut -c1-120)"
  fi
  rm -rf "$work/run" "$swap_dir"/* 2>/dev/null || true
  say "  $(placement_name "$p"), $l layers: $([[ $probe_ok -eq 1 ]] && echo "ok, $probe_tps tokens/s" || echo "failed: $probe_reason") [${probe_s} s]"
  runs+=("$(printf '%-15s %7s %10s  %-6s %9s %6s  %s' "$(placement_name "$p")" "$l" "$(params_of "$l")" \
    "$([[ $probe_ok -eq 1 ]] && echo ok || echo failed)" "$probe_tps" "$probe_s" "$probe_reason")")
}

rows=()
for p in ${placements//,/ }; do
  name=$(placement_name "$p")
  if [[ $p == offload ]]; then
    if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
      why="not measured: a GPU is here, but these probes train on run.device cpu"
    else
      why="no GPU: run.device cpu has no device memory to offload from"
    fi
    rows+=("$(printf '%-15s %7s %10s %9s %7s  %s' "$name" - - - - "$why")")
    say "$name: skipped ($why)"
    continue
  fi
  read -r pl pparams <<< "$(predicted "$name")"
  start=$pl
  (( start < 1 )) && start=1
  (( start > max_layers )) && start=$max_layers
  if [[ $dry -eq 1 ]]; then
    write_config "$p" "$start" "$work/dry.yaml"
    say "$name: predicted $pl layers ($pparams); first probe $start layers ($(params_of "$start") parameters):"
    sed 's/^/    /' "$work/dry.yaml" >&2
    continue
  fi
  lo=0 hi=$((max_layers + 1)) next=$start step=1 lo_tps="-" hi_reason=""
  while (( hi - lo > 1 )); do
    probe "$p" "$next"
    if [[ $probe_ok -eq 1 ]]; then lo=$next lo_tps=$probe_tps; else hi=$next hi_reason=$probe_reason; fi
    if (( hi == max_layers + 1 )); then        # no failure yet: step up
      next=$((lo + step)); (( next > max_layers )) && next=$max_layers; step=$((step * 2))
    elif (( lo == 0 )); then                    # no success yet: step down
      next=$((hi - step)); (( next < 1 )) && next=1; step=$((step * 2))
    else
      next=$(( (lo + hi) / 2 ))
    fi
    (( hi - lo > 1 )) || break
  done
  if (( lo == 0 )); then
    largest="none" lparams="-"
  else
    largest=$lo lparams=$(params_of "$lo")
  fi
  if (( hi > max_layers )); then fail="none up to --max-layers $max_layers"; else fail="$hi layers: $hi_reason"; fi
  ratio="-"
  (( lo > 0 && pl > 0 )) && ratio=$(awk -v a="${pparams%M}" -v b="${lparams%M}" 'BEGIN { printf "%.2f", a / b }')
  rows+=("$(printf '%-15s %7s %10s %9s %7s %10s %9s  %s' "$name" "$largest" "$lparams" "$lo_tps" "$pl" "$pparams" "$ratio" "$fail")")
done
[[ $dry -eq 1 ]] && { say "dry run: nothing trained"; exit 0; }

{
  echo "Measured $(date -u +%Y-%m-%d) on $(hostname): $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo) GiB RAM;" \
    "host memory ${host_mem:-auto (MemAvailable)}; NVMe $swap_dir${nvme_cap:+ (a ${nvme_cap} filesystem)}, $(awk -v b="$nvme_free" 'BEGIN { printf "%.2f", b / 2^30 }') GiB free"
  echo "family: GPT-2, hidden $hidden, $heads heads, vocabulary $vocab, sequence $seq, micro-batch 1; $steps steps per probe, fp32 on run.device cpu"
  echo
  printf '%-15s %7s %10s %9s %7s %10s %9s  %s\n' placement largest params "tokens/s" predict. params "pred/meas" "smallest failure"
  printf '%s\n' "${rows[@]}"
  echo
  echo "probes:"
  printf '%-15s %7s %10s  %-6s %9s %6s  %s\n' placement layers params result "tokens/s" seconds reason
  printf '%s\n' "${runs[@]}"
} | tee ${out:+"$out"}
