#!/usr/bin/env bash
# Enforces DESIGN.md's layering: a folder includes only from itself and the folders it may know.
# Fails naming each offending #include. usage: check_layering.sh <source root>
set -euo pipefail
root=${1:?source root}
declare -A allowed=(
  [core]="core"
  [offload]="core offload"
  [tensor]="core offload tensor"
  [autograd]="core offload tensor autograd"
  [models]="core offload tensor autograd models"
  [optim]="core offload tensor optim"
  [parallel]="core offload tensor autograd models optim parallel"
)
bad=0
for folder in "${!allowed[@]}"; do
  [[ -d "$root/$folder" ]] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    case " ${allowed[$folder]} " in
      *" $inc "*) ;;
      *) echo "layering violation: $file includes from $inc/ (${folder}/ may include: ${allowed[$folder]})"; bad=1 ;;
    esac
  done < <(grep -rnE '^#include "[a-z_]+/' "$root/$folder" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' | sed -E 's/^([^:]+):[0-9]+:/\1:/')
done
if ((bad)); then exit 1; fi
echo "layering: all includes respect DESIGN.md"
