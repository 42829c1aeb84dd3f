// CPU copy (strided, casting), fill, arange, random, concat.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "tensor/cpu/convert.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/strided.h"

namespace strata::tensor::cpu {

namespace {

// ---- contiguous conversions: the float <-> half pairs have loops the compiler vectorises ----

void f32_to_bf16(const float* s, BFloat16* d, int64_t n) {
  // BFloat16::from_float without branches (NaN stays a quiet NaN).
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(s[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    const bool is_nan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000;
    d[i].bits = static_cast<uint16_t>(is_nan ? nan : rounded);
  }
}

void bf16_to_f32(const BFloat16* s, float* d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    d[i] = std::bit_cast<float>(static_cast<uint32_t>(s[i].bits) << 16);
}

#if defined(__x86_64__)
// F16C converts 8 values per instruction with the same round-to-nearest-even as Float16.
__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* s, Float16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = Float16(s[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const Float16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
#endif

bool have_f16c() {
#if defined(__x86_64__)
  static const bool ok = cpu_features().f16c && cpu_features().avx2;
  return ok;
#else
  return false;
#endif
}

// d[i] = s[i] for n contiguous elements.
template <typename S, typename D>
void convert_contiguous(const S* s, D* d, int64_t n) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(d, s, static_cast<size_t>(n) * sizeof(S));
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, BFloat16>) {
    f32_to_bf16(s, d, n);
  } else if constexpr (std::is_same_v<S, BFloat16> && std::is_same_v<D, float>) {
    bf16_to_f32(s, d, n);
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Float16>) {
#if defined(__x86_64__)
    if (have_f16c()) return f32_to_f16_f16c(s, d, n);
#endif
    for (int64_t i = 0; i < n; ++i) d[i] = Float16(s[i]);
  } else if constexpr (std::is_same_v<S, Float16> && std::is_same_v<D, float>) {
#if defined(__x86_64__)
    if (have_f16c()) return f16_to_f32_f16c(s, d, n);
#endif
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i]);
  }
}

template <typename S, typename D>
void copy_typed(const Tensor& src, Tensor& dst) {
  const S* sp = static_cast<const S*>(src.data_ptr());
  D* dp = static_cast<D*>(dst.data_ptr());
  if (src.is_contiguous() && dst.is_contiguous()) {
    // Chunks of whole cache lines; the grain is in elements of the wider side.
    parallel_range(
        dst.numel(), [&](int64_t b, int64_t e) { convert_contiguous(sp + b, dp + b, e - b); },
        kParallelGrain * 4);
    return;
  }
  auto loop = make_strided_loop<2>(dst.shape(), {dst.strides(), src.strides()});
  for_each_row(loop,
               [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                 D* d = dp + off[0];
                 const S* s = sp + off[1];
                 if (in[0] == 1 && in[1] == 1) {
                   convert_contiguous(s, d, n);
                 } else if (in[1] == 0) {
                   const D v = convert<D>(s[0]);
                   for (int64_t i = 0; i < n; ++i) d[i * in[0]] = v;
                 } else if (in[0] == 1) {
                   for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i * in[1]]);
                 } else {
                   for (int64_t i = 0; i < n; ++i) d[i * in[0]] = convert<D>(s[i * in[1]]);
                 }
               });
}

// Element span [lo, hi] (in bytes from the storage base) that a view can touch.
std::pair<int64_t, int64_t> byte_extent(const Tensor& t) {
  int64_t lo = t.offset(), hi = t.offset();
  for (int d = 0; d < t.ndim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const int64_t es = static_cast<int64_t>(t.element_size());
  return {lo * es, (hi + 1) * es - 1};
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage()) return false;
  auto [alo, ahi] = byte_extent(a);
  auto [blo, bhi] = byte_extent(b);
  return alo <= bhi && blo <= ahi;
}

}  // namespace

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  STRATA_CHECK(src.device().is_cpu() && dst.device().is_cpu(),
               "CPU copy between {} and {}: cross-device copies go through the device's backend",
               src.str(), dst.str());
  STRATA_CHECK(src.shape() == dst.shape(), "copy from {} into {}", src.str(), dst.str());
  if (dst.numel() == 0) return;
  if (overlaps(src, dst)) {
    if (src.is_same(dst)) return;
    // Reading and writing the same bytes through different views: read everything first.
    Tensor tmp = Tensor::empty(src.shape(), src.dtype());
    copy(src, tmp);
    copy(tmp, dst);
    return;
  }
  visit_dtype(src.dtype(), [&](auto s) {
    visit_dtype(dst.dtype(), [&](auto d) { copy_typed<decltype(s), decltype(d)>(src, dst); });
  });
}

void CpuBackend::fill(Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    T* p = static_cast<T*>(dst.data_ptr());
    if (dst.is_contiguous()) {
      parallel_range(
          dst.numel(), [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); },
          kParallelGrain * 4);
      return;
    }
    auto loop = make_strided_loop<1>(dst.shape(), {dst.strides()});
    for_each_row(
        loop, [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& in) {
          T* d = p + off[0];
          for (int64_t i = 0; i < n; ++i) d[i * in[0]] = v;
        });
  });
}

void CpuBackend::arange(Tensor& dst, double start, double step) {
  STRATA_CHECK(dst.is_contiguous(), "arange into non-contiguous {}", dst.str());
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst.data_ptr());
    parallel_range(dst.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = from_double<T>(start + static_cast<double>(i) * step);
    });
  });
}

namespace {
// Element i of dst (row-major logical order) is element i of the stream (Note [Deterministic
// RNG]); other dtypes and layouts draw f32 and convert.
template <typename Draw>
void draw_into(Tensor& dst, Draw&& draw) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == DType::F32 && dst.is_contiguous()) {
    draw(static_cast<float*>(dst.data_ptr()), static_cast<size_t>(n));
    return;
  }
  std::vector<float> tmp(static_cast<size_t>(n));
  draw(tmp.data(), tmp.size());
  Tensor src = Tensor::from_blob(tmp.data(), dst.shape(), DType::F32);
  CpuBackend::instance().copy(src, dst);
}
}  // namespace

void CpuBackend::random_uniform(Tensor& dst, RngKey key, float lo, float hi) {
  draw_into(dst, [&](float* p, size_t n) { rng_uniform(p, n, key, lo, hi); });
}

void CpuBackend::random_normal(Tensor& dst, RngKey key, float mean, float stddev) {
  draw_into(dst, [&](float* p, size_t n) { rng_normal(p, n, key, mean, stddev); });
}

void CpuBackend::concat(const std::vector<Tensor>& xs, int dim, Tensor& out) {
  dim = out.shape().normalize(dim);
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.size(dim);
    if (len > 0 && x.numel() > 0) {
      Tensor part = out.narrow(dim, start, len);
      copy(x, part);
    }
    start += len;
  }
  STRATA_CHECK(start == out.size(dim), "concat: pieces add up to {} along dim {}, out has {}",
               start, dim, out.size(dim));
}

}  // namespace strata::tensor::cpu
