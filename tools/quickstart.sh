#!/usr/bin/env bash
# The README's first command, on a fresh Debian 12 machine: installs what is missing (apt), builds
# the tools, turns the English text of the `fortunes` package into byte-level token shards under
# datasets/fortunes, and trains configs/default.yaml (a tiny GPT-2 on the CPU, a few minutes).
# Extra arguments go to `train`, e.g. tools/quickstart.sh --set training.steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target train tokenize generate
if ! compgen -G "datasets/fortunes/train_*.bin" >/dev/null; then
  "$BUILD_DIR"/bin/tokenize --tokenizer byte --format fortune --output datasets/fortunes \
    /usr/share/games/fortunes
fi
"$BUILD_DIR"/bin/train --config configs/default.yaml "$@"
echo "quickstart: done. Sample more with: $BUILD_DIR/bin/generate --checkpoint runs/default --prompt 'The '"
