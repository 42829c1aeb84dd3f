#!/usr/bin/env bash
# Installs what is missing, builds Strata (Release), and runs the whole test suite.
# Tests labelled `cuda` skip themselves without a GPU; a second build then runs them on the CPU
# emulator of the CUDA device (Note [CUDA emulator] in cuda_emu/simt.h), so the kernels, the
# cuBLASLt and cuDNN calls and GPU training are exercised without one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900

# The emulated device needs only the CUDA toolkit's headers (no nvcc, no GPU, no CUDA library).
EMU_BUILD_DIR=${EMU_BUILD_DIR:-${BUILD_DIR}-emu}
if [[ "${STRATA_TEST_EMULATION:-auto}" == off ]]; then
  echo "test: STRATA_TEST_EMULATION=off, the CUDA tests did not run on the emulator"
elif ! compgen -G "/usr/local/cuda*/include/cuda_runtime_api.h" >/dev/null &&
     [[ ! -f /usr/include/cuda_runtime_api.h ]]; then
  echo "test: no CUDA toolkit headers (cuda_runtime_api.h), the CUDA tests did not run on the emulator"
else
  cmake -S . -B "$EMU_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA_EMULATION=ON
  cmake --build "$EMU_BUILD_DIR" -j "$JOBS" --target test_cuda test_cuda_emu bench_gpt2_cuda
  # Only the CUDA backend's tests and the emulator's own; everything else ran above.
  ctest --test-dir "$EMU_BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900 -L '^cuda'
  # Again with a block's threads and a grid's blocks in reverse order: a missing __syncthreads or
  # an assumed order between blocks shows in one of the two runs (simt.h, control.h).
  STRATA_CUDA_EMU_THREAD_ORDER=reverse STRATA_CUDA_EMU_BLOCK_ORDER=reverse \
    ctest --test-dir "$EMU_BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900 -L '^cuda$'
  STRATA_CUDA_EMU_BLOCK_ORDER=shuffle STRATA_CUDA_EMU_SEED="${STRATA_CUDA_EMU_SEED:-20261125}" \
    ctest --test-dir "$EMU_BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900 -L '^cuda$'
fi
