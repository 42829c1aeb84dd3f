// CPU reductions: sum_to (backward of broadcasting), reduce (sum/mean/max over one dim),
// sum_squares. See Note [Deterministic reductions].
//
// Note [Deterministic reductions]
// Every sum is accumulated in double, and the order of its additions is a function of the shape
// and strides alone, never of the thread count:
//   - A reduction is cut into chunks at fixed positions (kChunk elements, or kRowChunk reduced
//     indices); each chunk is summed on one thread, then the chunk partials are added in chunk
//     order. Threads only decide who computes which chunk.
//   - Inside a chunk, a contiguous run is summed into 8 accumulators by position (i mod 8),
//     combined pairwise at the end of the run; a strided run is summed in order. When the
//     innermost dim is kept (summing rows of [N, C] into [C]), each output column is summed in
//     row order, so C columns vectorise instead of one row.
// Max scans in index order and keeps the first maximum (the first NaN, if any).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/strided.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

constexpr int64_t kChunk = 16384;   // elements per chunk when the innermost dim is reduced
constexpr int64_t kRowChunk = 256;  // reduced indices per chunk when it is kept
constexpr int64_t kColBlock = 256;  // kept columns per task when the innermost dim is kept

struct Dim {
  int64_t size;
  int64_t stride;
};
using Dims = std::vector<Dim>;

// Merges each dim into the one before it where the pair is contiguous, keeping the order of a
// row-major walk.
void coalesce(Dims& dims) {
  Dims out;
  for (const Dim& d : dims) {
    if (!out.empty() && out.back().stride == d.stride * d.size) {
      out.back().size *= d.size;
      out.back().stride = d.stride;
    } else {
      out.push_back(d);
    }
  }
  dims = std::move(out);
}

int64_t count(const Dims& dims) {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

// Element offset of the `linear`-th index of a row-major walk over `dims`.
int64_t offset_of(const Dims& dims, int64_t linear) {
  int64_t off = 0;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    off += (linear % dims[i].size) * dims[i].stride;
    linear /= dims[i].size;
  }
  return off;
}

// A row-major walk over `dims` that yields element offsets one index at a time.
class Walk {
 public:
  Walk(const Dims& dims, int64_t start) : dims_(dims) {
    int64_t rem = start;
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      idx_[i] = rem % dims[i].size;
      rem /= dims[i].size;
      off_ += idx_[i] * dims[i].stride;
    }
  }
  int64_t offset() const { return off_; }
  void next() {
    for (int i = static_cast<int>(dims_.size()) - 1; i >= 0; --i) {
      if (++idx_[i] < dims_[i].size) {
        off_ += dims_[i].stride;
        return;
      }
      idx_[i] = 0;
      off_ -= (dims_[i].size - 1) * dims_[i].stride;
    }
  }

 private:
  const Dims& dims_;
  std::array<int64_t, kMaxDims> idx_{};
  int64_t off_ = 0;
};

// Sum of n floats at stride s (Note [Deterministic reductions]).
inline double sum_run(const float* p, int64_t n, int64_t s) {
  if (s != 1) {
    double a = 0;
    for (int64_t i = 0; i < n; ++i) a += p[i * s];
    return a;
  }
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(p[i + k]);
  for (int k = 0; i < n; ++i, ++k) acc[k] += static_cast<double>(p[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// out[o] (row-major over `kept`) = sum over `red` of x, times `scale`; x is f32.
void sum_kernel(const float* xp, Dims kept, Dims red, float* out, double scale) {
  coalesce(kept);
  coalesce(red);
  const int64_t n_out = count(kept), n_red = count(red);
  if (n_out == 0) return;
  if (n_red == 0) {
    for (int64_t o = 0; o < n_out; ++o) out[o] = static_cast<float>(0.0 * scale);
    return;
  }
  int64_t min_red_stride = INT64_MAX;
  for (const Dim& d : red) min_red_stride = std::min(min_red_stride, std::abs(d.stride));
  const bool inner_kept = !kept.empty() && std::abs(kept.back().stride) < min_red_stride;

  if (!inner_kept) {
    // Each output sums its own elements, chunk by chunk.
    if (red.empty()) red.push_back({1, 0});
    const Dim inner = red.back();
    Dims outer_red(red.begin(), red.end() - 1);
    const int64_t chunks = (n_red + kChunk - 1) / kChunk;
    std::vector<double> partial(chunks > 1 ? static_cast<size_t>(n_out * chunks) : 0);
    parallel_range(
        n_out * chunks,
        [&](int64_t lo, int64_t hi) {
          for (int64_t task = lo; task < hi; ++task) {
            const int64_t o = task / chunks, c = task % chunks;
            const float* base = xp + offset_of(kept, o);
            int64_t pos = c * kChunk;
            const int64_t end = std::min(n_red, pos + kChunk);
            double total = 0;
            while (pos < end) {
              const int64_t row = pos / inner.size, col = pos % inner.size;
              const int64_t len = std::min(inner.size - col, end - pos);
              total +=
                  sum_run(base + offset_of(outer_red, row) + col * inner.stride, len, inner.stride);
              pos += len;
            }
            if (chunks == 1) {
              out[o] = static_cast<float>(total * scale);
            } else {
              partial[static_cast<size_t>(task)] = total;
            }
          }
        },
        std::max<int64_t>(1, kParallelGrain / std::min(n_red, kChunk)));
    if (chunks > 1) {
      for (int64_t o = 0; o < n_out; ++o) {
        double total = 0;
        for (int64_t c = 0; c < chunks; ++c) total += partial[static_cast<size_t>(o * chunks + c)];
        out[o] = static_cast<float>(total * scale);
      }
    }
    return;
  }

  // The innermost dim is kept: sum whole blocks of columns row by row.
  const Dim col = kept.back();
  Dims outer_kept(kept.begin(), kept.end() - 1);
  const int64_t n_outer = count(outer_kept);
  const int64_t blocks = (col.size + kColBlock - 1) / kColBlock;
  const int64_t chunks = (n_red + kRowChunk - 1) / kRowChunk;
  std::vector<double> partial(chunks > 1 ? static_cast<size_t>(n_out * chunks) : 0);
  parallel_range(
      n_outer * blocks * chunks,
      [&](int64_t lo, int64_t hi) {
        double acc[kColBlock];
        for (int64_t task = lo; task < hi; ++task) {
          const int64_t c = task % chunks, b = (task / chunks) % blocks,
                        o = task / (chunks * blocks);
          const int64_t j0 = b * kColBlock, len = std::min(kColBlock, col.size - j0);
          const float* base = xp + offset_of(outer_kept, o) + j0 * col.stride;
          for (int64_t j = 0; j < len; ++j) acc[j] = 0;
          const int64_t r0 = c * kRowChunk, r1 = std::min(n_red, r0 + kRowChunk);
          Walk walk(red, r0);
          for (int64_t r = r0; r < r1; ++r, walk.next()) {
            const float* p = base + walk.offset();
            if (col.stride == 1) {
              for (int64_t j = 0; j < len; ++j) acc[j] += static_cast<double>(p[j]);
            } else {
              for (int64_t j = 0; j < len; ++j) acc[j] += static_cast<double>(p[j * col.stride]);
            }
          }
          const int64_t first = o * col.size + j0;
          for (int64_t j = 0; j < len; ++j) {
            if (chunks == 1) {
              out[first + j] = static_cast<float>(acc[j] * scale);
            } else {
              partial[static_cast<size_t>(c * n_out + first + j)] = acc[j];
            }
          }
        }
      },
      std::max<int64_t>(1, kParallelGrain / (kColBlock * std::min(n_red, kRowChunk))));
  if (chunks > 1) {
    parallel_range(n_out, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        double total = 0;
        for (int64_t c = 0; c < chunks; ++c) total += partial[static_cast<size_t>(c * n_out + o)];
        out[o] = static_cast<float>(total * scale);
      }
    });
  }
}

// Max over the single dim `red` of x, with first-index argmax.
void max_kernel(const float* xp, Dims kept, Dim red, float* out, int64_t* idx) {
  coalesce(kept);
  const int64_t n_out = count(kept);
  STRATA_CHECK(red.size > 0 || n_out == 0, "max over an empty dim");
  auto better = [](float v, float best) { return v > best || (v != v && best == best); };
  const bool inner_kept = !kept.empty() && std::abs(kept.back().stride) < std::abs(red.stride);
  if (!inner_kept) {
    parallel_range(
        n_out,
        [&](int64_t lo, int64_t hi) {
          for (int64_t o = lo; o < hi; ++o) {
            const float* p = xp + offset_of(kept, o);
            float best = p[0];
            int64_t at = 0;
            for (int64_t r = 1; r < red.size; ++r) {
              const float v = p[r * red.stride];
              if (better(v, best)) {
                best = v;
                at = r;
              }
            }
            out[o] = best;
            if (idx) idx[o] = at;
          }
        },
        std::max<int64_t>(1, kParallelGrain / red.size));
    return;
  }
  const Dim col = kept.back();
  Dims outer_kept(kept.begin(), kept.end() - 1);
  const int64_t blocks = (col.size + kColBlock - 1) / kColBlock;
  parallel_range(
      count(outer_kept) * blocks,
      [&](int64_t lo, int64_t hi) {
        float best[kColBlock];
        int64_t at[kColBlock];
        for (int64_t task = lo; task < hi; ++task) {
          const int64_t b = task % blocks, o = task / blocks;
          const int64_t j0 = b * kColBlock, len = std::min(kColBlock, col.size - j0);
          const float* base = xp + offset_of(outer_kept, o) + j0 * col.stride;
          for (int64_t j = 0; j < len; ++j) {
            best[j] = base[j * col.stride];
            at[j] = 0;
          }
          for (int64_t r = 1; r < red.size; ++r) {
            const float* p = base + r * red.stride;
            for (int64_t j = 0; j < len; ++j) {
              const float v = p[j * col.stride];
              if (better(v, best[j])) {
                best[j] = v;
                at[j] = r;
              }
            }
          }
          const int64_t first = o * col.size + j0;
          for (int64_t j = 0; j < len; ++j) {
            out[first + j] = best[j];
            if (idx) idx[first + j] = at[j];
          }
        }
      },
      std::max<int64_t>(1, kParallelGrain / (kColBlock * red.size)));
}

// Runs `body(x_f32, out_f32)` on f32 tensors, converting x and out around it when they are
// another float dtype (the arithmetic is f32/f64 either way; Note [Widening adapter]).
template <typename Body>
void with_f32(const Tensor& x, Tensor& out, Body&& body) {
  STRATA_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()),
               "reductions need float tensors, got {} -> {}", x.str(), out.str());
  F32Out o(out);
  body(widened(x), o.get());
  o.commit();
}

}  // namespace

void CpuBackend::sum_to(const Tensor& x, Tensor& out) {
  STRATA_CHECK(out.is_contiguous() && out.ndim() <= x.ndim(), "sum_to {} into {}", x.str(),
               out.str());
  with_f32(x, out, [&](const Tensor& xf, Tensor& of) {
    Dims kept, red;
    const int lead = xf.ndim() - of.ndim();
    for (int d = 0; d < xf.ndim(); ++d) {
      const int64_t os = d < lead ? 1 : of.size(d - lead);
      STRATA_CHECK(os == xf.size(d) || os == 1, "sum_to: {} does not broadcast to {}", of.str(),
                   xf.str());
      if (xf.size(d) == 1) continue;
      (os == 1 ? red : kept).push_back({xf.size(d), xf.stride(d)});
    }
    sum_kernel(xf.data<float>(), kept, red, of.data<float>(), 1.0);
  });
}

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) {
  dim = x.shape().normalize(dim);
  STRATA_CHECK(out.is_contiguous() && out.numel() * x.size(dim) == x.numel(),
               "reduce over dim {} of {} into {}", dim, x.str(), out.str());
  with_f32(x, out, [&](const Tensor& xf, Tensor& of) {
    Dims kept;
    for (int d = 0; d < xf.ndim(); ++d)
      if (d != dim && xf.size(d) != 1) kept.push_back({xf.size(d), xf.stride(d)});
    const Dim red{xf.size(dim), xf.stride(dim)};
    if (op == ReduceOp::Max) {
      int64_t* ip = nullptr;
      if (indices) {
        STRATA_CHECK(indices->dtype() == DType::I64 && indices->is_contiguous() &&
                         indices->numel() == of.numel(),
                     "max indices {}", indices->str());
        ip = indices->data<int64_t>();
      }
      max_kernel(xf.data<float>(), kept, red, of.data<float>(), ip);
      return;
    }
    const double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(red.size) : 1.0;
    Dims reds;
    if (red.size != 1) reds.push_back(red);
    sum_kernel(xf.data<float>(), kept, reds, of.data<float>(), scale);
  });
}

namespace {
// Note [Top-k] (tensor/ops.h): the words the CUDA kernel sorts (Note [CUDA top-k]), so both
// backends order by the same total order: the value's key (larger floats larger, -0 == +0, NaN
// largest), then the smaller index.
uint64_t top_k_word(float f, int64_t i) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) {
    u = 0xffffffffu;
  } else {
    if (u == 0x80000000u) u = 0;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return (uint64_t{u} << 32) | (0xffffffffull - static_cast<uint64_t>(i));
}
}  // namespace

void CpuBackend::top_k(const Tensor& x, Tensor& values, Tensor& indices) {
  STRATA_CHECK(x.ndim() == 2 && x.stride(1) == 1 && values.is_contiguous() &&
                   indices.is_contiguous() && indices.dtype() == DType::I64 &&
                   values.dtype() == x.dtype() && values.size(0) == x.size(0) &&
                   values.size(1) <= x.size(1),
               "top_k of {} into {} and {}", x.str(), values.str(), indices.str());
  const int64_t rows = x.size(0), n = x.size(1), k = values.size(1);
  STRATA_CHECK(n < 0xffffffffll, "top_k: rows of {} elements (at most 2^32 - 2)", n);
  // The order from the exactly widened values; the values themselves copied from x, so every
  // bit (a NaN's payload too) is the input's.
  const Tensor xf = widened(x);
  const float* xp = xf.data<float>();
  const int64_t rs = xf.stride(0), xrs = x.stride(0);
  const size_t es = x.element_size();
  const auto* xb = static_cast<const char*>(x.data_ptr());
  auto* vb = static_cast<char*>(values.data_ptr());
  int64_t* ip = indices.data<int64_t>();
  parallel_range(
      rows,
      [&](int64_t lo, int64_t hi) {
        std::vector<uint64_t> words(static_cast<size_t>(n));
        for (int64_t r = lo; r < hi; ++r) {
          const float* row = xp + r * rs;
          for (int64_t i = 0; i < n; ++i) words[static_cast<size_t>(i)] = top_k_word(row[i], i);
          std::partial_sort(words.begin(), words.begin() + k, words.end(), std::greater<>());
          for (int64_t j = 0; j < k; ++j) {
            const auto i = static_cast<int64_t>(0xffffffffull - (words[j] & 0xffffffffull));
            std::memcpy(vb + static_cast<size_t>(r * k + j) * es,
                        xb + static_cast<size_t>(r * xrs + i) * es, es);
            ip[r * k + j] = i;
          }
        }
      },
      1);
}

namespace {
template <typename T>
double sum_squares_typed(const T* p, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  parallel_range(
      chunks,
      [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          const T* q = p + c * kChunk;
          const int64_t m = std::min(kChunk, n - c * kChunk);
          double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t i = 0;
          for (; i + 8 <= m; i += 8)
            for (int k = 0; k < 8; ++k) {
              const double v = static_cast<float>(q[i + k]);
              acc[k] += v * v;
            }
          for (int k = 0; i < m; ++i, ++k) {
            const double v = static_cast<float>(q[i]);
            acc[k] += v * v;
          }
          partial[static_cast<size_t>(c)] =
              ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        }
      },
      2);
  double total = 0;
  for (double v : partial) total += v;
  return total;
}
}  // namespace

double CpuBackend::sum_squares(const Tensor& x) {
  const Tensor xc = x.contiguous();
  const int64_t n = xc.numel();
  switch (xc.dtype()) {
    case DType::F32:
      return sum_squares_typed(xc.data<float>(), n);
    case DType::BF16:
      return sum_squares_typed(xc.data<BFloat16>(), n);
    case DType::F16:
      return sum_squares_typed(xc.data<Float16>(), n);
    default:
      break;
  }
  STRATA_CHECK(false, "sum_squares of a non-float tensor {}", x.str());
  return 0;
}

}  // namespace strata::tensor::cpu
