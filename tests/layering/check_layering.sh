#!/usr/bin/env bash
# Enforces the layering of docs/design.md: every folder with code includes only from itself and
# the folders below it in `order`. Fails naming each offending #include, each folder with code that
# the table does not place, and any entry of the table that would allow a cycle.
# usage: check_layering.sh <source root>
set -euo pipefail
root=${1:?source root}

# Bottom to top. A folder may include from itself and the folders its line names, all of which
# must come earlier in this list (so the allowed includes form no cycle).
order=(core offload tensor comm autograd models optim parallel data sampling runtime cuda_emu tools tests)
declare -A allowed=(
  [core]=""
  [offload]="core"
  [tensor]="core offload"
  [comm]="core offload tensor"
  [autograd]="core offload tensor comm"
  [models]="core offload tensor comm autograd"
  [optim]="core offload tensor"
  [parallel]="core offload tensor comm autograd models optim"
  [data]="core offload tensor"
  [sampling]="core offload tensor comm autograd models"
  [runtime]="core offload tensor comm autograd models optim parallel data sampling"
  [cuda_emu]=""
  [tools]="core offload tensor comm autograd models optim parallel data sampling runtime cuda_emu"
  [tests]="core offload tensor comm autograd models optim parallel data sampling runtime cuda_emu tools"
)
bad=0

# The table itself: every allowed folder comes earlier in `order`.
declare -A position=()
for i in "${!order[@]}"; do position[${order[$i]}]=$i; done
for folder in "${order[@]}"; do
  for dep in ${allowed[$folder]}; do
    if [[ -z "${position[$dep]+x}" || ${position[$dep]} -ge ${position[$folder]} ]]; then
      echo "layering table: $folder/ may include $dep/, which is not below it (a cycle)"
      bad=1
    fi
  done
done

# Every top-level folder with C++ or CUDA sources has a place in the table.
while IFS= read -r dir; do
  name=$(basename "$dir")
  [[ -n "${position[$name]+x}" ]] && continue
  if [[ -n $(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print -quit) ]]; then
    echo "layering: $name/ holds code but has no place in tests/layering/check_layering.sh"
    bad=1
  fi
done < <(find "$root" -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name 'build*' ! -name third_party)

for folder in "${order[@]}"; do
  [[ -d "$root/$folder" ]] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    case " $folder ${allowed[$folder]} " in
      *" $inc "*) ;;
      *) echo "layering violation: $file includes from $inc/ ($folder/ may include: $folder ${allowed[$folder]})"; bad=1 ;;
    esac
  done < <(grep -rnE '^#include "[a-z_]+/' "$root/$folder" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' | sed -E 's/^([^:]+):[0-9]+:/\1:/')
done
if ((bad)); then exit 1; fi
echo "layering: all includes respect docs/design.md (${#order[@]} folders)"
