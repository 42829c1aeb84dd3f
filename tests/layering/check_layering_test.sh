#!/usr/bin/env bash
# The layering check fails where it should: on a copy of the tree's folder names with one include
# that runs up a layer, one from tools/ into tests/, and one folder the table does not place.
# usage: check_layering_test.sh <source root>
set -euo pipefail
root=${1:?source root}
check="$root/tests/layering/check_layering.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/core" "$tmp/tensor" "$tmp/tools"
echo '#include "core/error.h"' >"$tmp/tensor/ok.h"
bash "$check" "$tmp" >/dev/null || { echo "FAIL: a tree that respects the layers was refused"; exit 1; }

expect_refusal() {  # <what> <pattern the message must hold>
  local out
  if out=$(bash "$check" "$tmp" 2>&1); then echo "FAIL: $1 passed the check"; exit 1; fi
  grep -q "$2" <<<"$out" || { echo "FAIL: $1: message lacks '$2': $out"; exit 1; }
}
echo '#include "tensor/tensor.h"' >"$tmp/core/up.h"
expect_refusal "core/ including tensor/" "core/up.h includes from tensor/"
rm "$tmp/core/up.h"
echo '#include "tests/support/mutate.h"' >"$tmp/tools/bench.cpp"
expect_refusal "tools/ including tests/" "tools/bench.cpp includes from tests/"
rm "$tmp/tools/bench.cpp"
mkdir -p "$tmp/newlib" && echo 'int x;' >"$tmp/newlib/x.cpp"
expect_refusal "an unplaced folder" "newlib/ holds code but has no place"
echo "check_layering_test: all refusals seen"
