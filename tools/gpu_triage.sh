#!/usr/bin/env bash
# Runs each test of a GoogleTest binary in a process of its own, to tell which tests fail on a
# GPU and which only failed beside them (docs/gpu.md, "When tests fail on the GPU").
#
#   bash tools/gpu_triage.sh BIN FILTER OUTDIR [BUDGET_S]
#
# Why: test_cuda runs every test in one process. A kernel that reads or writes out of bounds on a
# real GPU leaves a sticky error (e.g. CUDA error 700, an illegal memory access) that the CUDA
# context keeps: every later CUDA call of the process fails, so one bad kernel fails every test
# after it, and the error surfaces at some later call (a copy, a wait), not at the kernel. Here
# each test of FILTER (a --gtest_filter pattern) runs alone with CUDA_LAUNCH_BLOCKING=1 (each
# launch waits for its kernel, so the error is reported at the launch that caused it) and
# STRATA_GPU_POISON=on (Note [GPU caching allocator]), at most STRATA_TRIAGE_TEST_S seconds each
# (60 by default), all of them within BUDGET_S seconds (480 by default; a test that would start
# later is listed as not run). Then the first two tests that failed run again under
# compute-sanitizer's memcheck, which names the kernel and the address of a bad access, if it is
# installed ($COMPUTE_SANITIZER, else on PATH, else /usr/local/cuda/bin) and time is left.
#
# Writes OUTDIR/triage.md (one row per test: passed, skipped, FAILED, timed out, not run) and,
# for each test that did not pass, OUTDIR/triage/<test>.log (its output), and for the memcheck
# runs OUTDIR/triage/<test>.memcheck.log. Exit status: 0 when every test passed or skipped, 1 when
# one did not (or did not run), 2 on bad arguments or a binary that cannot list its tests.
set -uo pipefail

if (($# < 3 || $# > 4)); then
  sed -n '2,/^set -uo/{/^set -uo/d;p}' "$0" >&2
  exit 2
fi
bin=$1
filter=$2
out=$3
budget=${4:-480}
per_test=${STRATA_TRIAGE_TEST_S:-60}
for n in "$budget" "$per_test"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gpu_triage: '$n' is not a positive number of seconds" >&2; exit 2; }
done
[[ -x $bin ]] || { echo "gpu_triage: $bin is not an executable test binary" >&2; exit 2; }

# --gtest_list_tests prints each suite as `Suite.` (a typed or parameterised one may be followed
# by `  # TypeParam = ...`) and its tests under it indented by two spaces (`  Name  # GetParam()
# = ...`). Anything else (a log line of the binary's start) is not a suite.
listing=$("$bin" --gtest_list_tests --gtest_filter="$filter" 2>&1) || {
  echo "gpu_triage: $bin --gtest_list_tests failed:" >&2
  printf '%s\n' "$listing" >&2
  exit 2
}
tests=()
suite=""
while IFS= read -r line; do
  if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_/]*\.)([[:space:]]|$) ]]; then
    suite=${BASH_REMATCH[1]}
  elif [[ -n $suite && $line =~ ^\ \ ([A-Za-z_][A-Za-z0-9_/]*)([[:space:]]|$) ]]; then
    tests+=("$suite${BASH_REMATCH[1]}")
  else
    suite=""
  fi
done <<< "$listing"
if ((${#tests[@]} == 0)); then
  echo "gpu_triage: no test of $bin matches '$filter'" >&2
  exit 2
fi

mkdir -p "$out/triage"
summary=$out/triage.md
start=$SECONDS
failed=()
passed=0
skipped=0
bad=0
{
  echo "Each test of \`$(basename "$bin") --gtest_filter='$filter'\` alone, with"
  echo "CUDA_LAUNCH_BLOCKING=1 and STRATA_GPU_POISON=on (at most ${per_test} s each, ${budget} s in all):"
  echo
  echo "| test | result | seconds |"
  echo "|---|---|---|"
} > "$summary"
for t in "${tests[@]}"; do
  log="$out/triage/${t//\//_}.log"
  left=$((budget - (SECONDS - start)))
  if ((left < 2)); then
    echo "| $t | not run (the ${budget} s budget was spent) | |" >> "$summary"
    bad=$((bad + 1))
    continue
  fi
  limit=$((per_test < left ? per_test : left))
  t0=$SECONDS
  CUDA_LAUNCH_BLOCKING=1 STRATA_GPU_POISON=on timeout -k 5 "$limit" "$bin" --gtest_filter="$t" \
    > "$log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  if ((rc == 0)) && grep -q '^\[  SKIPPED \]' "$log"; then
    result="skipped"
    skipped=$((skipped + 1))
    rm -f "$log"
  elif ((rc == 0)) && grep -q '^\[  PASSED  \] 1 test' "$log"; then
    result=passed
    passed=$((passed + 1))
    rm -f "$log"
  elif ((rc == 124)); then
    result="**timed out** after ${limit} s (log: triage/$(basename "$log"))"
    failed+=("$t")
  elif ((rc == 0)); then
    result="**exit 0 but no PASSED line** (log: triage/$(basename "$log"))"
    failed+=("$t")
  else
    # The first line that names a CUDA, cuBLAS or cuDNN error, else the first gtest failure.
    why=$(grep -m1 -E 'CUDA error|CUBLAS_STATUS|CUDNN_STATUS|cudnn|InternalError' "$log" ||
      grep -m1 -E 'Failure|FAILED' "$log" || true)
    why=${why//|/\\|}
    result="**FAILED** (exit $rc) ${why:0:200} (log: triage/$(basename "$log"))"
    failed+=("$t")
  fi
  echo "| $t | $result | $took |" >> "$summary"
done
bad=$((bad + ${#failed[@]}))
echo >> "$summary"
echo "${#tests[@]} tests: $passed passed, $skipped skipped, ${#failed[@]} failed or timed out," \
  "$((bad - ${#failed[@]})) not run." >> "$summary"

# compute-sanitizer on the first two failures: it names the kernel, the thread and the address of
# a bad access (memcheck), far slower than the test alone, so it gets what is left of the budget.
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if ((${#failed[@]} > 0)); then
  if [[ ! -x $sanitizer ]]; then
    echo "compute-sanitizer not found ($sanitizer): no memcheck runs." >> "$summary"
  else
    for t in "${failed[@]:0:2}"; do
      left=$((budget - (SECONDS - start)))
      if ((left < 10)); then
        echo "memcheck of $t not run: the budget was spent." >> "$summary"
        continue
      fi
      mlog="$out/triage/${t//\//_}.memcheck.log"
      STRATA_GPU_POISON=on timeout -k 5 "$left" "$sanitizer" --tool memcheck --error-exitcode 99 \
        "$bin" --gtest_filter="$t" > "$mlog" 2>&1
      echo "memcheck of $t: exit $? (99: it found errors; 124: cut short) (log: triage/$(basename "$mlog"))" \
        >> "$summary"
    done
  fi
fi
cat "$summary"
((bad == 0))
