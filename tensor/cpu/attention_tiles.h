#pragma once
// The two block-product kernels of CPU flash attention (tensor/cpu/attention.cpp), declared here
// so that tests can check every ISA build of them, not only the one this CPU picks.
//
// Note [Attention tile kernels]
// All block products of attention are done by two kernels over strips of 16 columns: `scores`
// (C = A B with B given transposed, so a row of C is a sum of rows of B^T) and `accumulate`
// (C += P X). A group of R rows keeps R x 16 accumulators in registers as GCC vector-extension
// values (Note [Vectorised exp]) and uses each loaded strip of B or X R times; left to itself
// GCC vectorises these loops the wrong way round (across the reduction, with shuffles). They
// are built twice: for the baseline ISA (4-lane vectors, R = 2) and, chosen at run time, for
// AVX2 + FMA (8 lanes, R = 4). The multiply-adds fuse in the AVX2 build, so its bits differ
// from the baseline build's, but never between runs or thread counts on one machine. Every
// output element is a sum in ascending index order whatever the row grouping, so leftover rows
// give the same bits as grouped ones.
#include <cstdint>
#include <vector>

namespace strata::tensor::cpu {

inline constexpr int64_t kAttentionTileWidth = 64;  // columns of a score tile
inline constexpr int64_t kAttentionStrip = 16;      // accumulate's w must be a multiple of this

struct AttentionTiles {
  const char* isa;  // "baseline" or "avx2"
  // c[i][j] = sum_{d < kd} a[i][d] * bt[d][j] for i < m, j < 64; bt is [kd][64], c is [m][64].
  void (*scores)(const float* a, int64_t lda, int64_t m, int64_t kd, const float* bt, float* c);
  // c[i][0..w) += sum_{j < n} p[i, j] * x[j][0..w) for i < m, where p[i, j] is p[i * prs + j *
  // pcs] (so a transposed p needs no copy) and rows of x and c are ldx and ldc apart.
  void (*accumulate)(const float* p, int64_t prs, int64_t pcs, int64_t m, int64_t n, const float* x,
                     int64_t ldx, int64_t w, float* c, int64_t ldc);
};

// Every build of the kernels that this binary has and this CPU can run, baseline first.
std::vector<AttentionTiles> available_attention_tiles();

// The build attention uses: the widest available, unless the environment variable
// STRATA_ATTENTION_ISA names another ("baseline", "avx2"; for tests and benchmarks; read once
// per process). Naming one this CPU cannot run is a UserError.
const AttentionTiles& attention_tiles();

}  // namespace strata::tensor::cpu
