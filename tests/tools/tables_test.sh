#!/usr/bin/env bash
# tools/tables.sh on a tiny family (hidden 64, a 12 MiB host budget): the dry run prints the
# prediction and the first probes without training; the search trains real probes and ends, for
# every placement, with a success and a failure one block apart; ZeRO-Offload is skipped with
# its reason; tools/plot_tables.sh draws the table; nothing is left in --nvme-dir; bad arguments
# are refused.
#   bash tests/tools/tables_test.sh REPO_ROOT BUILD_DIR
set -uo pipefail
root=$1 build=$2
tables="$root/tools/tables.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what" >&2
    fails=$((fails + 1))
  fi
}

# Byte-level data: a few thousand tokens of text.
for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$tmp/text.txt"
"$build/bin/tokenize" --tokenizer byte --output "$tmp/data" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize" >&2; exit 1; }
mkdir -p "$tmp/nvme"
tiny=(--data "$tmp/data/train_*.bin" --nvme-dir "$tmp/nvme" --host-mem 12MiB --hidden 64 --heads 4
  --seq 32 --max-layers 40)

bash "$tables" "$build" "${tiny[@]}" --dry-run > "$tmp/dry.out" 2> "$tmp/dry.err"
check "dry run exits 0" test $? -eq 0
check "dry run prints the prediction" grep -q '^  in memory  ' "$tmp/dry.out"
check "dry run names the first probe" grep -q 'ZeRO-Inf-NVMe: predicted [0-9]* layers' "$tmp/dry.err"
check "dry run trains nothing" grep -q 'dry run: nothing trained' "$tmp/dry.err"
check "dry run has no probe" bash -c "! grep -q 'tokens/s' '$tmp/dry.err'"

bash "$tables" "$build" "${tiny[@]}" --placements memory,offload,cpu,nvme --out "$tmp/table.txt" \
  > "$tmp/run.out" 2> "$tmp/run.err"
check "the search exits 0" test $? -eq 0
check "--out holds the table" grep -q '^placement  *largest' "$tmp/table.txt"
check "a progress line per probe" test "$(grep -c '^tables:   ' "$tmp/run.err")" -eq \
  "$(awk '/^probes:/ { p = 1; getline; next } p && NF' "$tmp/table.txt" | wc -l)"
for name in "in memory" "ZeRO-Inf-CPU" "ZeRO-Inf-NVMe"; do
  row=$(grep "^$name  " "$tmp/table.txt" | head -1)
  largest=$(echo "${row:15}" | awk '{ print $1 }')
  check "$name: a largest model ($row)" test -n "$largest" -a "$largest" -ge 1 2> /dev/null
  check "$name: the smallest failure is one block larger ($row)" \
    grep -q "^$name .* $((largest + 1)) layers: " <<< "$row"
  check "$name: the largest trained" grep -Eq "^$name +$largest +[0-9.]+M  ok +[0-9.]+ " "$tmp/table.txt"
  check "$name: the failure is a probe" grep -Eq "^$name +$((largest + 1)) +[0-9.]+M  failed " "$tmp/table.txt"
done
check "ZeRO-Offload skipped with its reason" grep -q '^ZeRO-Offload .*no GPU' "$tmp/table.txt"
bash "$root/tools/plot_tables.sh" "$tmp/table.txt" "$tmp/table.svg" > /dev/null
check "plot_tables.sh draws a bar per placement that ran" test "$(grep -c '<rect ' "$tmp/table.svg")" -eq 3
check "and names ZeRO-Offload's reason" grep -q 'no GPU' "$tmp/table.svg"
check "nothing left in --nvme-dir" test -z "$(ls -A "$tmp/nvme")"

bash "$tables" "$build" --placements disk > /dev/null 2> "$tmp/bad.err"
check "an unknown placement exits 2" test $? -eq 2
check "and says so" grep -q "'disk' is not memory, offload, cpu or nvme" "$tmp/bad.err"
bash "$tables" "$tmp/no-build" > /dev/null 2> "$tmp/bad.err"
check "a build without train exits 2" test $? -eq 2

if [[ $fails -gt 0 ]]; then
  echo "--- table" >&2; cat "$tmp/table.txt" >&2
  echo "--- progress" >&2; cat "$tmp/run.err" >&2
  exit 1
fi
echo "tables_test: all passed"
