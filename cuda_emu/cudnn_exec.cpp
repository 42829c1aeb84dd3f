// The emulated cuDNN's execution (Note [Emulated cuDNN] in cudnn.cpp): a finalized graph run
// node by node on the CPU, every value in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/cudnn_graph.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/simt.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu::emu_cudnn {

namespace {

// Calls f(offset in t for every coordinate of `shape`, the coordinate) in row-major order;
// dims where t has 1 and `shape` more are broadcast.
template <typename F>
void for_each(const TensorInfo& shape, const F& f) {
  int64_t c[kMaxDims] = {};
  const int64_t n = shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    f(c);
    for (int d = shape.nd - 1; d >= 0; --d) {
      if (++c[d] < shape.dims[d]) break;
      c[d] = 0;
    }
  }
}

int64_t offset(const TensorInfo& t, const int64_t* c) {
  int64_t o = 0;
  for (int d = 0; d < t.nd; ++d) o += (t.dims[d] == 1 ? 0 : c[d]) * t.strides[d];
  return o;
}

float pointwise(cudnnPointwiseMode_t m, float x, float b, float t) {
  switch (m) {
    case CUDNN_POINTWISE_ADD:
      return x + b;
    case CUDNN_POINTWISE_SUB:
      return x - b;
    case CUDNN_POINTWISE_MUL:
      return x * b;
    case CUDNN_POINTWISE_DIV:
      return x / b;
    case CUDNN_POINTWISE_EXP:
      return std::exp(x);
    case CUDNN_POINTWISE_LOG:
      return std::log(x);
    case CUDNN_POINTWISE_CMP_GE:
      return x >= b ? 1.f : 0.f;
    case CUDNN_POINTWISE_BINARY_SELECT:
      return t != 0.f ? x : b;
    default:  // IDENTITY
      return x;
  }
}

}  // namespace

void run_op(Run& r, const OpInfo& op) {
  const Graph& g = *r.g;
  const TensorInfo& out = g.tensors[op.out];
  switch (op.kind) {
    case OpKind::Pointwise:
      for_each(out, [&](const int64_t* c) {
        float v;
        if (op.pw == CUDNN_POINTWISE_GEN_INDEX) {
          v = static_cast<float>(c[op.axis]);
        } else {
          const float x = r.read(op.in[0], offset(g.tensors[op.in[0]], c));
          const float b = op.in.size() > 1 ? r.read(op.in[1], offset(g.tensors[op.in[1]], c)) : 0;
          const float t = op.in.size() > 2 ? r.read(op.in[2], offset(g.tensors[op.in[2]], c)) : 0;
          v = pointwise(op.pw, x, b, t);
        }
        r.write(op.out, offset(out, c), v);
      });
      break;
    case OpKind::Reduction: {
      const bool max = op.red == CUDNN_REDUCE_TENSOR_MAX;
      std::vector<float> acc(static_cast<size_t>(out.extent()),
                             max ? -INFINITY : 0.f);  // by output offset
      const TensorInfo& x = g.tensors[op.in[0]];
      for_each(x, [&](const int64_t* c) {
        const float v = r.read(op.in[0], offset(x, c));
        float& a = acc[static_cast<size_t>(offset(out, c))];
        a = max ? std::max(a, v) : a + v;
      });
      for_each(out, [&](const int64_t* c) {
        const int64_t o = offset(out, c);
        r.write(op.out, o, acc[static_cast<size_t>(o)]);
      });
      break;
    }
    case OpKind::Matmul: {
      // Operands gathered into dense f32 rows first (A as [M][K], B transposed as [N][K]), so the
      // inner loop is a plain dot product in k order.
      const TensorInfo &a = g.tensors[op.in[0]], &b = g.tensors[op.in[1]];
      const int n = out.nd;
      const int64_t m = out.dims[n - 2], nn = out.dims[n - 1], kk = a.dims[n - 1];
      TensorInfo batch = out;
      batch.dims[n - 2] = batch.dims[n - 1] = 1;
      std::vector<float> am(static_cast<size_t>(m * kk)), bt(static_cast<size_t>(nn * kk));
      for_each(batch, [&](const int64_t* c0) {
        int64_t c[kMaxDims];
        std::copy(c0, c0 + n, c);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t q = 0; q < kk; ++q) {
            c[n - 2] = i, c[n - 1] = q;
            am[static_cast<size_t>(i * kk + q)] = r.read(op.in[0], offset(a, c));
          }
        for (int64_t q = 0; q < kk; ++q)
          for (int64_t j = 0; j < nn; ++j) {
            c[n - 2] = q, c[n - 1] = j;
            bt[static_cast<size_t>(j * kk + q)] = r.read(op.in[1], offset(b, c));
          }
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nn; ++j) {
            const float* x = am.data() + i * kk;
            const float* y = bt.data() + j * kk;
            float sum = 0.f;
            for (int64_t q = 0; q < kk; ++q) sum += x[q] * y[q];
            c[n - 2] = i, c[n - 1] = j;
            r.write(op.out, offset(out, c), sum);
          }
      });
      break;
    }
    case OpKind::Reshape: {
      // The same storage: element at offset o of y is the element at offset o of x.
      const TensorInfo& x = g.tensors[op.in[0]];
      std::vector<float> storage(static_cast<size_t>(x.extent()), 0.f);
      for_each(x, [&](const int64_t* c) {
        const int64_t o = offset(x, c);
        storage[static_cast<size_t>(o)] = r.read(op.in[0], o);
      });
      for_each(out, [&](const int64_t* c) {
        const int64_t o = offset(out, c);
        r.write(op.out, o, storage[static_cast<size_t>(o)]);
      });
      break;
    }
  }
}

void open_range(const void* p, size_t bytes) {
  DeviceMemory& mem = DeviceMemory::get();
  if (Allocation* a = mem.find(p, bytes)) mem.open(*a);
}

}  // namespace strata::cuda_emu::emu_cudnn
