#pragma once
// Strided iteration for CPU kernels that take any layout (see Note [Strided iteration]).
//
// Note [Strided iteration]
// An elementwise kernel over N operands walks one common shape; element (i0, .., ik) of operand
// `op` lives at sum_j i_j * strides[op][j] elements from its base (zero strides broadcast).
// make_strided_loop simplifies that walk before any element is touched:
//   - dims of size 1 are dropped;
//   - dims are ordered by operand 0's strides, largest outermost (operand 0 is the output, so
//     writes run forwards through memory even when the output is a permuted view);
//   - neighbouring dims that are contiguous with each other in *every* operand are merged.
// A contiguous tensor thus becomes one dim, and a row-broadcast one two dims. The innermost dim
// is a "row": for_each_row hands a kernel each row's base offsets and the per-operand inner
// strides, and the kernel runs a tight loop that the compiler vectorises when those strides are
// 1 or 0 (kernels branch on that). Rows are independent, so the way they are split across
// threads cannot change any result (Note [Backend contract]).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "tensor/shape.h"

namespace strata::tensor::cpu {

// Below this many elements a kernel runs on the calling thread: an OpenMP fork costs a few
// microseconds, about what one thread needs for 32K simple float operations.
inline constexpr int64_t kParallelGrain = 32768;

template <int N>
struct StridedLoop {
  int ndim = 0;  // after simplification; 0 means "no elements"
  std::array<int64_t, kMaxDims> size{};
  std::array<std::array<int64_t, kMaxDims>, N> stride{};

  int64_t inner_size() const { return ndim ? size[ndim - 1] : 0; }
  int64_t num_rows() const {
    if (ndim == 0) return 0;
    int64_t r = 1;
    for (int d = 0; d + 1 < ndim; ++d) r *= size[d];
    return r;
  }
  std::array<int64_t, N> inner_stride() const {
    std::array<int64_t, N> s{};
    for (int op = 0; op < N; ++op) s[op] = stride[op][ndim - 1];
    return s;
  }
};

// `strides[op]` are operand op's strides for `shape` (same ndim; use 0 to broadcast).
template <int N>
StridedLoop<N> make_strided_loop(const Shape& shape, const std::array<Shape, N>& strides) {
  StridedLoop<N> loop;
  if (shape.numel() == 0) return loop;
  // Keep dims larger than 1.
  std::array<int, kMaxDims> dims{};
  int nd = 0;
  for (int d = 0; d < shape.ndim(); ++d)
    if (shape[d] != 1) dims[nd++] = d;
  if (nd == 0) {  // a single element
    loop.ndim = 1;
    loop.size[0] = 1;
    return loop;
  }
  // Order by operand strides (operand 0 first), largest outermost. Insertion sort is stable, so
  // ties keep the logical order.
  auto outer_than = [&](int a, int b) {
    for (int op = 0; op < N; ++op) {
      int64_t sa = strides[op][a] < 0 ? -strides[op][a] : strides[op][a];
      int64_t sb = strides[op][b] < 0 ? -strides[op][b] : strides[op][b];
      if (sa != sb) return sa > sb;
    }
    return false;
  };
  for (int i = 1; i < nd; ++i)
    for (int j = i; j > 0 && outer_than(dims[j], dims[j - 1]); --j) std::swap(dims[j], dims[j - 1]);
  // Merge inner into outer where contiguous in every operand.
  int out = 0;
  loop.size[0] = shape[dims[0]];
  for (int op = 0; op < N; ++op) loop.stride[op][0] = strides[op][dims[0]];
  for (int i = 1; i < nd; ++i) {
    int d = dims[i];
    bool merge = true;
    for (int op = 0; op < N; ++op)
      merge = merge && loop.stride[op][out] == strides[op][d] * shape[d];
    if (merge) {
      loop.size[out] *= shape[d];
      for (int op = 0; op < N; ++op) loop.stride[op][out] = strides[op][d];
    } else {
      ++out;
      loop.size[out] = shape[d];
      for (int op = 0; op < N; ++op) loop.stride[op][out] = strides[op][d];
    }
  }
  loop.ndim = out + 1;
  return loop;
}

// Strides of `t_shape`/`t_strides` broadcast (right-aligned) to `shape`: 0 where t is missing
// or has size 1.
inline Shape broadcast_strides(const Shape& t_shape, const Shape& t_strides, const Shape& shape) {
  Shape s;
  s.resize(shape.ndim());
  int lead = shape.ndim() - t_shape.ndim();
  for (int d = 0; d < shape.ndim(); ++d) {
    int td = d - lead;
    s[d] = (td < 0 || t_shape[td] == 1) ? 0 : t_strides[td];
  }
  return s;
}

// Calls f(offsets, n, inner_strides) for every row of `loop` (or piece of a row), where
// offsets[op] is operand op's element offset of the piece's first element and the piece has n
// elements. When there are few rows, long rows are cut into pieces so every thread gets work.
template <int N, typename F>
void for_each_row(const StridedLoop<N>& loop, F&& f) {
  const int64_t rows = loop.num_rows();
  const int64_t n = loop.inner_size();
  if (rows == 0 || n == 0) return;
  const std::array<int64_t, N> inner = loop.inner_stride();
  const int outer_nd = loop.ndim - 1;
  // Pieces per row: enough for ~64 work items in all, none shorter than 4096 elements.
  int64_t piece = n;
  if (rows < 64 && n > 8192) piece = std::max<int64_t>(4096, (n * rows + 63) / 64);
  const int64_t pieces = (n + piece - 1) / piece;
  auto run = [&](int64_t begin, int64_t end) {
    // Odometer over the outer dims, started at the row of item `begin`.
    std::array<int64_t, kMaxDims> idx{};
    std::array<int64_t, N> off{};
    int64_t rem = begin / pieces;
    for (int d = outer_nd - 1; d >= 0; --d) {
      idx[d] = rem % loop.size[d];
      rem /= loop.size[d];
      for (int op = 0; op < N; ++op) off[op] += idx[d] * loop.stride[op][d];
    }
    int64_t p = begin % pieces;
    for (int64_t item = begin; item < end; ++item) {
      std::array<int64_t, N> o = off;
      for (int op = 0; op < N; ++op) o[op] += p * piece * inner[op];
      f(o, std::min(piece, n - p * piece), inner);
      if (++p < pieces) continue;
      p = 0;
      for (int d = outer_nd - 1; d >= 0; --d) {
        if (++idx[d] < loop.size[d]) {
          for (int op = 0; op < N; ++op) off[op] += loop.stride[op][d];
          break;
        }
        idx[d] = 0;
        for (int op = 0; op < N; ++op) off[op] -= (loop.size[d] - 1) * loop.stride[op][d];
      }
    }
  };
  const int64_t items = rows * pieces;
  if (items == 1 || rows * n < kParallelGrain) {
    run(0, items);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    run(items * t / nt, items * (t + 1) / nt);
  }
}

// Calls f(begin, end) over [0, n) split into one contiguous range per thread (or the whole range
// on the calling thread when n < grain). For kernels over independent elements only.
template <typename F>
void parallel_range(int64_t n, F&& f, int64_t grain = kParallelGrain) {
  if (n <= 0) return;
  if (n < grain) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) f(b, e);
  }
}

}  // namespace strata::tensor::cpu
