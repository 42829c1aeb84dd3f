#!/usr/bin/env bash
# The host's side of a GPU training step, measured where there is no GPU (Note [Emulator dry run]
# in cuda_emu/control.h): bench_gpt2_cuda from the CUDA emulation build, with the emulated
# device doing no work and offering about what an H100 80GB leaves free (80000 MiB; set
# STRATA_CUDA_EMU_MEMORY_MIB for another). --fill then finds each model's micro-batch as on the
# GPU, and the table gives per step the host's milliseconds beside the GPU's at 50% MFU, the
# kernels, cuBLASLt matmuls and cuDNN graphs launched, the waits that leave the device idle, and
# the peak device memory. Nothing the device would compute is computed: losses are meaningless.
#
#   tools/bench/run_host_overhead.sh [BUILD_DIR] [bench_gpt2_cuda options]
#
# BUILD_DIR (default build-emu) is configured and built when it has no bench_gpt2_cuda. Without
# options: --fill --warmup 2 --steps 5 for GPT-2 124M, 350M, 774M and 1558M at T = 1024.
# --launches adds each model's kernel launches by site with their grids (Note [Launch sites] in
# cuda_emu/control.h); --profile N the per-op table with its roofline bound.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build-emu
if [[ $# -gt 0 && $1 != -* ]]; then
  BUILD=$1
  shift
fi
if [[ ! -x $BUILD/bin/bench_gpt2_cuda ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA_EMULATION=ON >&2
  cmake --build "$BUILD" -j "$(nproc)" --target bench_gpt2_cuda >&2
fi
if ! grep -q '^STRATA_CUDA_EMULATION:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "run_host_overhead: $BUILD is not a CUDA emulation build (configure it with" \
    "-DSTRATA_CUDA_EMULATION=ON, or give another build directory)" >&2
  exit 2
fi
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--fill --warmup 2 --steps 5)
STRATA_CUDA_EMU_DRY_RUN=1 STRATA_CUDA_EMU_MEMORY_MIB=${STRATA_CUDA_EMU_MEMORY_MIB:-80000} \
  exec "$BUILD/bin/bench_gpt2_cuda" "${args[@]}"
