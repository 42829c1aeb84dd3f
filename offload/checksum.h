#pragma once
// Block checksums for the NVMe store.
//
// Note [Block checksum function]
// Inputs of up to 240 bytes are hashed with XXH64, longer ones with the long-input path of
// XXH3-64 (both Yann Collet's xxHash, seed 0, default secret), written out here rather than
// pulled in. The result equals XXH64 or XXH3_64bits of the same bytes; tests check it against
// the reference values. The store's blocks are long (1 MiB by default), so the XXH3 path is the
// one that matters: its 8 lanes of 32x32->64-bit multiplies map onto SSE2/AVX2, where XXH64's
// 64-bit multiply chain cannot, which is what keeps verifying a read from costing as much CPU
// as the read itself on a small machine (Note [Checksums overlap the I/O]). The NVMe store keeps
// its sums in memory only, but files carry them too (Note [Safetensors digests], Note [Checkpoint
// digests]), so the function must not change: both hashes are fixed by their specification and
// checked against reference values. Neither hash is
// cryptographic; they catch torn, stale, misplaced or bit-flipped blocks.
#include <cstddef>
#include <cstdint>

namespace strata::offload {

uint64_t checksum64(const void* data, size_t bytes);

// The instruction sets checksum64 can run its long-input loop with; it picks the widest the CPU
// has. Exposed so tests can check that every kernel gives the same result.
enum class ChecksumKernel { Scalar, Sse2, Avx2 };
bool checksum_kernel_available(ChecksumKernel k);
uint64_t checksum64_with(ChecksumKernel k, const void* data, size_t bytes);

}  // namespace strata::offload
