#pragma once
// Block checksums for the NVMe store.
//
// XXH64 (Yann Collet's xxHash, 64-bit variant), written out here rather than pulled in: it is
// ~60 lines, runs at memory speed on one core, and catches the faults the store cares about
// (torn or stale blocks, flipped bits, a block read from the wrong offset). It is not
// cryptographic and is not meant to be.
#include <cstddef>
#include <cstdint>

namespace strata::offload {

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace strata::offload
