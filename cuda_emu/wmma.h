#pragma once
// nvcuda::wmma (CUDA's warp matrix functions, mma.h) for the emulated device; included by
// device.h (Note [CUDA emulator] in simt.h).
//
// Note [Emulated WMMA]
// What kernels may rely on, for 16x16x16 tiles of half or __nv_bfloat16 inputs with float
// accumulators: fragment (num_elements, x[]), fill_fragment, load_matrix_sync, store_matrix_sync
// and mma_sync. CUDA leaves the mapping of a fragment's elements to lanes unspecified, so a
// kernel can only fill fragments, apply one operation to every element, and move them through
// memory; here lane l holds the elements 8l .. 8l + 7 of the tile in row-major order (any mapping
// would do for such a kernel; one that assumes the hardware's shows up as wrong results).
//   - Every _sync function is a __syncwarp over all 32 lanes first: each lane of the warp must
//     call it (a missing or exited lane aborts, as a deadlock would be on the device).
//   - load/store check what the device requires: a 32-byte aligned pointer and ldm a multiple of
//     8 elements (16-bit types) or 4 (float); anything else aborts with the call named.
//   - mma_sync(d, a, b, c) gathers the warp's a, b and c through a per-warp scratch and gives
//     each lane its d elements as c + a(r,0) b(0,n) + ... + a(r,15) b(15,n), one f32 sum in k
//     order. A product of two half or bf16 values is exact in f32, so this is the exact result
//     up to f32 rounding of the sum; the tensor cores add in another order (and with their own
//     internal precision), so results agree with a GPU to f32 rounding noise, not bitwise.
// Other shapes (32x8x16, 8x32x16), tf32/int/fp8 fragments and the sub-byte types are not
// provided: a kernel that uses them does not compile in the emulation build.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16,
                "the CUDA emulator provides 16x16x16 WMMA fragments only (Note [Emulated WMMA])");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, __nv_bfloat16>,
                "the CUDA emulator provides half, __nv_bfloat16 and float fragments only");
  enum { num_elements = 8 };
  using element_type = T;
  T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace strata::cuda_emu::wmma_detail {

inline float to_float(float v) {
  return v;
}
inline float to_float(__half v) {
  return __half2float(v);
}
inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    return __float2bfloat16_rn(v);
  }
}

[[noreturn]] inline void fail(const char* call, const char* what) {
  std::fprintf(stderr, "CUDA emulator: %s: %s (Note [Emulated WMMA])\n", call, what);
  std::abort();
}

// The device's requirements on a fragment's memory operand.
template <typename T>
inline void check_operand(const char* call, const void* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) fail(call, "pointer is not 32-byte aligned");
  if (ldm % (sizeof(T) == 4 ? 4 : 8) != 0)
    fail(call, "ldm is not a multiple of 8 (16-bit elements) or 4 (float) elements");
}

// Element e of this lane's fragment: (row, col) of the 16x16 tile (Note [Emulated WMMA]).
inline int lane_of_thread() {
  const unsigned linear =
      g_thread_idx.x + g_block_dim.x * (g_thread_idx.y + g_block_dim.y * g_thread_idx.z);
  return static_cast<int>(linear % 32);
}
inline int warp_of_thread() {
  const unsigned linear =
      g_thread_idx.x + g_block_dim.x * (g_thread_idx.y + g_block_dim.y * g_thread_idx.z);
  return static_cast<int>(linear / 32);
}

// One 16x16 A, B and C per warp (at most 32 warps in a block).
inline float* warp_scratch() {
  static float scratch[32][3 * 256];
  return scratch[warp_of_thread()];
}

template <bool RowMajor, typename T, typename F>
inline void load_tile(F& f, const T* p, unsigned ldm) {
  const int lane = lane_of_thread();
  for (int e = 0; e < 8; ++e) {
    const int t = 8 * lane + e, r = t / 16, c = t % 16;
    f.x[e] = from_float<typename F::element_type>(to_float(
        RowMajor ? p[r * static_cast<int64_t>(ldm) + c] : p[c * static_cast<int64_t>(ldm) + r]));
  }
}

}  // namespace strata::cuda_emu::wmma_detail

namespace nvcuda::wmma {

template <typename Use, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, const V& v) {
  for (int e = 0; e < 8; ++e)
    f.x[e] = ::strata::cuda_emu::wmma_detail::from_float<T>(static_cast<float>(v));
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, typename T, typename L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>,
                "load_matrix_sync without a layout argument needs a matrix_a/matrix_b fragment");
  __syncwarp();
  ::strata::cuda_emu::wmma_detail::check_operand<T>("load_matrix_sync", p, ldm);
  ::strata::cuda_emu::wmma_detail::load_tile<std::is_same_v<L, row_major>>(f, p, ldm);
}

// accumulator: the layout is an argument.
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  __syncwarp();
  ::strata::cuda_emu::wmma_detail::check_operand<float>("load_matrix_sync", p, ldm);
  if (layout == mem_row_major)
    ::strata::cuda_emu::wmma_detail::load_tile<true>(f, p, ldm);
  else
    ::strata::cuda_emu::wmma_detail::load_tile<false>(f, p, ldm);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  __syncwarp();
  ::strata::cuda_emu::wmma_detail::check_operand<float>("store_matrix_sync", p, ldm);
  const int lane = ::strata::cuda_emu::wmma_detail::lane_of_thread();
  for (int e = 0; e < 8; ++e) {
    const int t = 8 * lane + e, r = t / 16, c = t % 16;
    const int64_t at = layout == mem_row_major ? r * static_cast<int64_t>(ldm) + c
                                               : c * static_cast<int64_t>(ldm) + r;
    p[at] = f.x[e];
  }
}

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  namespace det = ::strata::cuda_emu::wmma_detail;
  static_assert(!std::is_same_v<T, float>, "mma_sync takes half or bf16 a and b fragments");
  __syncwarp();
  float* s = det::warp_scratch();
  const int lane = det::lane_of_thread();
  for (int e = 0; e < 8; ++e) {
    s[8 * lane + e] = det::to_float(a.x[e]);
    s[256 + 8 * lane + e] = det::to_float(b.x[e]);
    s[512 + 8 * lane + e] = c.x[e];
  }
  __syncwarp();  // every lane's part is in
  for (int e = 0; e < 8; ++e) {
    const int t = 8 * lane + e, r = t / 16, n = t % 16;
    float sum = s[512 + t];
    for (int k = 0; k < 16; ++k) sum += s[r * 16 + k] * s[256 + k * 16 + n];
    d.x[e] = sum;
  }
  __syncwarp();  // every lane has read before the scratch is used again
}

}  // namespace nvcuda::wmma
