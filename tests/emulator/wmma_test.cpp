// The emulator's warp matrix functions (Note [Emulated WMMA] in wmma.h): a 16x16x16 product
// through every layout, padded leading dimensions, accumulation, and the aborts for what the
// device does not allow. Compiled like a .cu file of the emulation build: the kernels are real
// kernels. Inputs are small integers, so every correct order of summation gives the same exact
// result and the comparisons can be exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_emu/device_vector.h"

namespace strata::cuda_emu {
namespace {

using namespace nvcuda;

constexpr int kLd = 24;  // padded leading dimension of every 16x16 operand in memory

// d = a b + c for one warp. a is stored row-major when A_ROW (a[r * kLd + k]), else column-major
// (a[k * kLd + r]); b likewise with B_ROW; c is read and d written with C_LAYOUT.
template <typename T, bool A_ROW, bool B_ROW>
__global__ void product(const T* a, const T* b, const float* c, float* d, bool col_major_c) {
  using LA = std::conditional_t<A_ROW, wmma::row_major, wmma::col_major>;
  using LB = std::conditional_t<B_ROW, wmma::row_major, wmma::col_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  const wmma::layout_t lc = col_major_c ? wmma::mem_col_major : wmma::mem_row_major;
  wmma::load_matrix_sync(fa, a, kLd);
  wmma::load_matrix_sync(fb, b, kLd);
  wmma::load_matrix_sync(fc, c, kLd, lc);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::mma_sync(fc, fa, fb, fc);  // accumulates: d = 2 a b + c
  wmma::store_matrix_sync(d, fc, kLd, lc);
}

// fill_fragment and an elementwise scale through x[], which every mapping allows.
__global__ void filled(float* d) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::fill_fragment(f, 1.5f);
  for (int e = 0; e < f.num_elements; ++e) f.x[e] *= 2.f;
  wmma::store_matrix_sync(d, f, 16, wmma::mem_row_major);
}

// Lane 5 does not take part in the product.
__global__ void missing_lane(const __half* a, float* d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, a, 16);
  if (threadIdx.x != 5) wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

__global__ void misaligned(const __half* a) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, a + 1, 16);
}

// Element (r, c) of a 16x16 operand stored row-major (or column-major) with leading dim kLd.
int64_t at(int r, int c, bool row) {
  return row ? r * kLd + c : c * kLd + r;
}

template <typename T>
T from_int(int v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return __float2bfloat16_rn(static_cast<float>(v));
}

template <typename T, bool A_ROW, bool B_ROW>
void check_product(bool col_major_c) {
  SCOPED_TRACE(::testing::Message()
               << (A_ROW ? "a row" : "a col") << ", " << (B_ROW ? "b row" : "b col") << ", "
               << (col_major_c ? "c col" : "c row"));
  // A(r, k) = (r + 2k) % 7 - 3, B(k, n) = (3k + n) % 5 - 2, C(r, n) = r - n; padding = 99.
  std::vector<T> a(16 * kLd, from_int<T>(99)), b(16 * kLd, from_int<T>(99));
  std::vector<float> c(16 * kLd, 99.f);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      a[at(r, k, A_ROW)] = from_int<T>((r + 2 * k) % 7 - 3);
      b[at(r, k, B_ROW)] = from_int<T>((3 * r + k) % 5 - 2);
      c[at(r, k, !col_major_c)] = static_cast<float>(r - k);
    }
  DeviceVector<T> da(a), db(b);
  DeviceVector<float> dc(c), dd(16 * kLd, -1.f);
  STRATA_LAUNCH(1, 32, 0, nullptr, product<T, A_ROW, B_ROW>)
  (da.get(), db.get(), dc.get(), dd.get(), col_major_c);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> d = dd.host();
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      int want = r - n;
      for (int k = 0; k < 16; ++k) want += 2 * ((r + 2 * k) % 7 - 3) * ((3 * k + n) % 5 - 2);
      ASSERT_EQ(d[at(r, n, !col_major_c)], static_cast<float>(want)) << r << " " << n;
    }
  // The padding between rows is not written.
  for (int r = 0; r < 16; ++r)
    for (int x = 16; x < kLd; ++x) ASSERT_EQ(d[r * kLd + x], -1.f);
}

TEST(CudaEmuWmma, ProductsInEveryLayout) {
  for (bool col_c : {false, true}) {
    check_product<__half, true, true>(col_c);
    check_product<__half, true, false>(col_c);
    check_product<__half, false, true>(col_c);
    check_product<__nv_bfloat16, false, false>(col_c);
    check_product<__nv_bfloat16, true, false>(col_c);
  }
}

TEST(CudaEmuWmma, FillAndElementwise) {
  DeviceVector<float> d(256, 0.f);
  STRATA_LAUNCH(1, 32, 0, nullptr, filled)(d.get());
  for (float v : d.host()) ASSERT_EQ(v, 3.f);
}

using CudaEmuWmmaDeathTest = ::testing::Test;

TEST(CudaEmuWmmaDeathTest, ALaneMissingFromAnMmaOrAMisalignedOperandAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceVector<__half> a(512, __float2half_rn(1.f));
  DeviceVector<float> d(256);
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 32, 0, nullptr, missing_lane)(a.get(), d.get()), cudaDeviceSynchronize()),
      "missing_lane");
  EXPECT_DEATH((STRATA_LAUNCH(1, 32, 0, nullptr, misaligned)(a.get()), cudaDeviceSynchronize()),
               "load_matrix_sync: pointer is not 32-byte aligned");
}

}  // namespace
}  // namespace strata::cuda_emu
