#!/usr/bin/env bash
# tools/gpu_triage.sh against a stand-in for a GoogleTest binary (no GPU needed): each test runs
# alone with CUDA_LAUNCH_BLOCKING=1 and STRATA_GPU_POISON=on, passes, skips, failures, hangs and
# tests past the budget each get their row, the failures go to the memcheck tool, the exit
# status says whether all passed, and bad arguments are refused.
#   bash tests/tools/gpu_triage_test.sh REPO_ROOT
set -uo pipefail
root=$1
triage="$root/tools/gpu_triage.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect DESCRIPTION COMMAND...: the command must succeed
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what" >&2
    fails=$((fails + 1))
  fi
}

# The stand-in: five tests (one typed, with comments, after a log line), listed as GoogleTest
# lists them (only those the filter's patterns match), each acting out one outcome.
cat > "$tmp/fake_test" <<'FAKE'
#!/usr/bin/env bash
if [[ ${1:-} == --gtest_list_tests ]]; then
  IFS=: read -r -a patterns <<< "${2#--gtest_filter=}"
  echo "I 12:00:00 a log line the binary prints at start."
  suite=""
  for t in Fake.Passes Fake.Fails Typed/0.Skips Slow.Hangs Slow.NeverRuns; do
    for p in "${patterns[@]}"; do
      # shellcheck disable=SC2053
      if [[ $t == $p ]]; then
        if [[ ${t%%.*}. != "$suite" ]]; then
          suite=${t%%.*}.
          [[ $suite == Typed/0. ]] && echo "$suite  # TypeParam = float" || echo "$suite"
        fi
        [[ $t == Typed/0.Skips ]] && echo "  Skips  # a comment" || echo "  ${t#*.}"
        break
      fi
    done
  done
  exit 0
fi
[[ ${CUDA_LAUNCH_BLOCKING:-} == 1 && ${STRATA_GPU_POISON:-} == on ]] || { echo "env not set"; exit 3; }
case ${1:-} in
  --gtest_filter=Fake.Passes) echo "[  PASSED  ] 1 test." ;;
  --gtest_filter=Fake.Fails)
    echo "C++ exception: CUDA error 700: an illegal memory access was encountered | in copy"
    echo "[  FAILED  ] Fake.Fails"
    exit 1 ;;
  --gtest_filter=Typed/0.Skips) echo "Skipped: no CUDA device"; echo "[  SKIPPED ] Typed/0.Skips" ;;
  --gtest_filter=Slow.Hangs) sleep 30 ;;
  --gtest_filter=Slow.NeverRuns) echo "[  PASSED  ] 1 test." ;;
  *) echo "unexpected arguments: $*"; exit 4 ;;
esac
FAKE
cat > "$tmp/fake_sanitizer" <<'FAKE'
#!/usr/bin/env bash
echo "sanitizer args: $*"
exit 99
FAKE
chmod +x "$tmp/fake_test" "$tmp/fake_sanitizer"

# Every test; Hangs is cut at 3 s (less if the budget has less left), and then less than 2 s of
# the 4 s budget is left, so Slow.NeverRuns does not start.
STRATA_TRIAGE_TEST_S=3 COMPUTE_SANITIZER="$tmp/fake_sanitizer" \
  bash "$triage" "$tmp/fake_test" '*' "$tmp/out" 4 > "$tmp/stdout" 2>&1
rc=$?
summary="$tmp/out/triage.md"
expect "exit 1 when a test fails (got $rc)" test "$rc" = 1
expect "Passes passed" grep -q '^| Fake.Passes | passed | ' "$summary"
expect "Skips skipped" grep -q '^| Typed/0.Skips | skipped | ' "$summary"
expect "Fails failed, with its CUDA error (| escaped)" \
  grep -q '^| Fake.Fails | \*\*FAILED\*\* (exit 1) C++ exception: CUDA error 700: an illegal memory access was encountered \\| in copy (log: triage/Fake.Fails.log) | ' "$summary"
expect "Hangs timed out" grep -q '^| Slow.Hangs | \*\*timed out\*\* after [23] s ' "$summary"
expect "NeverRuns not run" grep -q '^| Slow.NeverRuns | not run (the 4 s budget was spent) | |$' "$summary"
expect "no row for the log line" bash -c "! grep -q '^| I ' '$summary'"
expect "the count line" grep -q '^5 tests: 1 passed, 1 skipped, 2 failed or timed out, 1 not run.$' "$summary"
expect "failures keep their logs, passes and skips do not" \
  test -f "$tmp/out/triage/Fake.Fails.log" -a -f "$tmp/out/triage/Slow.Hangs.log" \
  -a ! -e "$tmp/out/triage/Fake.Passes.log" -a ! -e "$tmp/out/triage/Typed_0.Skips.log"
expect "the summary goes to stdout too" grep -q '^| Fake.Fails | ' "$tmp/stdout"
# The budget was spent, so memcheck did not run; a larger budget lets it.
expect "memcheck skipped when the budget is spent" \
  grep -q '^memcheck of Fake.Fails not run: the budget was spent.$' "$summary"
STRATA_TRIAGE_TEST_S=2 COMPUTE_SANITIZER="$tmp/fake_sanitizer" \
  bash "$triage" "$tmp/fake_test" 'Fake.Fails:Fake.Passes' "$tmp/out2" 60 > /dev/null 2>&1
rc=$?
expect "exit 1 again (got $rc)" test "$rc" = 1
expect "memcheck ran on the failure" \
  grep -q '^memcheck of Fake.Fails: exit 99 ' "$tmp/out2/triage.md"
expect "memcheck got the binary and the test" \
  grep -q "^sanitizer args: --tool memcheck --error-exitcode 99 $tmp/fake_test --gtest_filter=Fake.Fails$" \
  "$tmp/out2/triage/Fake.Fails.memcheck.log"
expect "the filter picked two tests" grep -q '^2 tests: 1 passed, 0 skipped, 1 failed' "$tmp/out2/triage.md"
# No sanitizer: said so.
COMPUTE_SANITIZER="$tmp/none" bash "$triage" "$tmp/fake_test" 'Fake.Fails' "$tmp/out3" 60 \
  > /dev/null 2>&1
expect "a missing sanitizer is reported" \
  grep -q "^compute-sanitizer not found ($tmp/none): no memcheck runs.$" "$tmp/out3/triage.md"
# All pass: exit 0.
bash "$triage" "$tmp/fake_test" 'Fake.Passes:Typed/*' "$tmp/out4" 60 > /dev/null 2>&1
rc=$?
expect "exit 0 when all pass or skip (got $rc)" test "$rc" = 0
# Bad arguments: exit 2 and a message naming the problem.
bash "$triage" "$tmp/fake_test" 'Nothing.*' "$tmp/out5" > "$tmp/err" 2>&1
rc=$?
expect "no matching test: exit 2 (got $rc)" test "$rc" = 2
expect "no matching test: said so" grep -q "no test of $tmp/fake_test matches 'Nothing.\*'" "$tmp/err"
bash "$triage" "$tmp/missing" '*' "$tmp/out6" > "$tmp/err" 2>&1
rc=$?
expect "missing binary: exit 2 (got $rc)" test "$rc" = 2
expect "missing binary: said so" grep -q "$tmp/missing is not an executable test binary" "$tmp/err"
bash "$triage" "$tmp/fake_test" '*' "$tmp/out7" 0s > "$tmp/err" 2>&1
rc=$?
expect "bad budget: exit 2 (got $rc)" test "$rc" = 2
expect "bad budget: said so" grep -q "'0s' is not a positive number of seconds" "$tmp/err"

if ((fails > 0)); then
  echo "gpu_triage_test: $fails checks failed; the last summary:" >&2
  cat "$summary" >&2
  exit 1
fi
echo "gpu_triage_test: all checks passed"
