#pragma once
// Note [Kernel launches]: every .cu file launches through STRATA_LAUNCH(grid, block, smem,
// stream, kernel)(args...) instead of writing kernel<<<grid, block, smem, stream>>>(args...).
// Under nvcc the two are the same. A build with STRATA_CUDA_EMULATION compiles the .cu files as
// plain C++ and runs their kernels on the CPU (cuda_emu/); its force-included device header
// defines the macro as a call into the emulator, which a triple-chevron launch could not be.
#if !defined(STRATA_CUDA_EMULATION)
#define STRATA_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
