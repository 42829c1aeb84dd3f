// The CUDA backend's reductions: sum_to, reduce, top_k, the sums of squares of the gradient
// norm and gradient clipping's scale (kernels in reduce.cu and top_k.cu).
#include "tensor/cuda/cuda_backend.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

void CudaBackend::sum_to(const Tensor& x, Tensor& out) {
  OpScope prof(stream_, "sum_to", 0, bytes_of({&x, &out}));
  STRATA_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()) && out.is_contiguous(),
               "sum_to {} -> {}", x.str(), out.str());
  // [N, C] -> [C] (a bias gradient: out is x's trailing dims, every leading dim summed):
  // Note [CUDA column sums].
  const int lead_dims = x.ndim() - out.ndim();
  bool trailing = x.is_contiguous() && lead_dims >= 0;
  for (int d = 0; trailing && d < out.ndim(); ++d) trailing = out.size(d) == x.size(d + lead_dims);
  const int64_t c = out.numel();
  // Any row count: with few rows and many columns (GPT-2 1558M's position-embedding gradient,
  // 16 rows of 1.6M) the generic reduce gave every column a block of its own.
  if (trailing && c > 0) {
    const int64_t n = x.numel() / c;
    const int64_t chunks = (n + kColumnSumRows - 1) / kColumnSumRows;
    Tensor s = scratch(chunks * c * static_cast<int64_t>(sizeof(double)));
    launched(
        launch_column_sum(x.data_ptr(), dt(x.dtype()), n, c, static_cast<double*>(s.data_ptr()),
                          out.data_ptr(), dt(out.dtype()), stream_),
        "sum_to");
    return;
  }
  // Outer: x's dims kept by out (stride 0 elsewhere); reduced: the others.
  Strided outer, red;
  outer.ndim = x.ndim();
  const int lead = x.ndim() - out.ndim();
  for (int d = 0; d < x.ndim(); ++d) {
    const int od = d - lead;
    const bool kept = od >= 0 && out.size(od) == x.size(d);
    outer.shape[d] = kept ? x.size(d) : 1;
    outer.strides[d] = kept ? x.stride(d) : 0;
    if (!kept) {
      red.shape[red.ndim] = x.size(d);
      red.strides[red.ndim] = x.stride(d);
      ++red.ndim;
    }
  }
  launch_reduce(0, x.data_ptr(), dt(x.dtype()), outer, red, out.data_ptr(), dt(out.dtype()),
                out.numel(), nullptr, stream_);
  check_launch("sum_to");
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) {
  OpScope prof(stream_, "reduce", 0, bytes_of({&x, &out}));
  STRATA_CHECK(out.is_contiguous(), "reduce into non-contiguous {}", out.str());
  if (out.numel() == 0) return;
  STRATA_CHECK(x.size(dim) > 0 || op != ReduceOp::Max, "max over an empty dim of {}", x.str());
  Strided outer = view_of(x), red;
  outer.shape[dim] = 1;
  red.ndim = 1;
  red.shape[0] = x.size(dim);
  red.strides[0] = x.stride(dim);
  int64_t* ip = nullptr;
  if (indices && op == ReduceOp::Max) {
    STRATA_CHECK(indices->dtype() == DType::I64 && indices->is_contiguous(), "max indices {}",
                 indices->str());
    ip = indices->data<int64_t>();
  }
  launch_reduce(static_cast<int>(op), x.data_ptr(), dt(x.dtype()), outer, red, out.data_ptr(),
                dt(out.dtype()), out.numel(), ip, stream_);
  check_launch("reduce");
}

void CudaBackend::top_k(const Tensor& x, Tensor& values, Tensor& indices) {
  OpScope prof(stream_, "top_k", 0, bytes_of({&x, &values, &indices}));
  STRATA_CHECK(x.ndim() == 2 && x.stride(1) == 1 && values.is_contiguous() &&
                   indices.is_contiguous() && indices.dtype() == DType::I64 &&
                   values.dtype() == x.dtype() && values.size(0) == x.size(0) &&
                   values.size(1) >= 1 && values.size(1) <= x.size(1),
               "top_k of {} into {} and {}", x.str(), values.str(), indices.str());
  const int64_t k = values.size(1);
  if (k > kTopKMax || x.size(1) >= (int64_t{1} << 31)) {
    // Past the kernel's shared-memory candidates (Note [CUDA top-k]): the CPU backend's result,
    // which is the same by Note [Top-k], copied back (a wait for the device).
    const Tensor h = x.to(Device::cpu());
    Tensor hv = Tensor::empty(values.shape(), values.dtype());
    Tensor hi = Tensor::empty(indices.shape(), DType::I64);
    backend_for(Device::cpu()).top_k(h, hv, hi);
    values.copy_(hv);
    indices.copy_(hi);
    return;
  }
  STRATA_CHECK(launch_top_k(dt(x.dtype()), x.data_ptr(), x.size(0), x.size(1), x.stride(0), k,
                            values.data_ptr(), indices.data<int64_t>(), stream_),
               "top_k of {}: not a float dtype", x.str());
  check_launch("top_k");
}

double CudaBackend::sum_squares(const Tensor& x) {
  return sum_squares_many({x}).front();
}

namespace {
double bytes_of_all(const std::vector<Tensor>& xs) {
  double b = 0;
  for (const Tensor& x : xs) b += bytes_of({&x});
  return b;
}
}  // namespace

std::vector<double> CudaBackend::sum_squares_many(const std::vector<Tensor>& xs) {
  OpScope prof(stream_, "sum_squares", 0, bytes_of_all(xs));
  // Each tensor's total lands in its own slot of one device array; one copy back of those, one
  // wait. The tensors go in groups of up to kGroup: each writes its row of block partials, then
  // one launch adds every row of the group into its slot. The stream runs the groups in order,
  // so they share the rows.
  constexpr int64_t kGroup = 64;
  const auto n = static_cast<int64_t>(xs.size());
  Tensor s = scratch((n + kGroup * kSumSquaresBlocks) * static_cast<int64_t>(sizeof(double)));
  double* totals = static_cast<double*>(s.data_ptr());
  double* rows = totals + n;
  for (int64_t g0 = 0; g0 < n; g0 += kGroup) {
    const int64_t g1 = std::min(n, g0 + kGroup);
    for (int64_t i = g0; i < g1; ++i) {
      const Tensor& x = xs[static_cast<size_t>(i)];
      STRATA_CHECK(is_floating(x.dtype()), "sum_squares of {}", x.str());
      // An empty tensor's one block reads nothing and writes a row of zeros: its total is 0.
      const bool as_is = x.is_contiguous() || x.numel() == 0;
      Tensor xc = as_is ? x : Tensor::empty(x.shape(), x.dtype(), device());
      if (!as_is) copy_on_device(x, xc);
      launched(launch_sum_squares_partials(xc.data_ptr(), dt(xc.dtype()), xc.numel(),
                                           rows + (i - g0) * kSumSquaresBlocks, stream_),
               "sum_squares");
    }
    launch_sum_squares_totals(rows, static_cast<int>(g1 - g0), totals + g0, stream_);
    check_launch("sum_squares");
  }
  std::vector<double> r(xs.size(), 0.0);
  check_cuda(
      cudaMemcpyAsync(r.data(), totals, r.size() * sizeof(double), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync");
  synchronize();
  return r;
}

void CudaBackend::scale_unless_equal(Tensor& x, const Tensor& g, float expected) {
  if (!x.is_contiguous()) return Backend::scale_unless_equal(x, g, expected);
  OpScope prof(stream_, "scale_unless_equal", 0, bytes_of({&g}));
  launched(launch_scale_unless_equal(compute_dt("scale_unless_equal", x), x.data_ptr(), x.numel(),
                                     g.data<float>(), expected, stream_),
           "scale_unless_equal");
}

}  // namespace strata::tensor::cuda
