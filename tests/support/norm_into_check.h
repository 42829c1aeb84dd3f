#pragma once
// Note [Norm gradients into their buffer] (tensor/ops.h), checked on any device (tests only): the
// norm backwards given `into` add their weight (and bias) gradients into buffers that already
// hold gradients, with the bits tensor::axpy_ (what AccumulateGrad runs) gives adding the
// returned gradients into the same buffers; their dx does not change, and the dweight/dbias they
// return are the buffers themselves.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "tensor/ops.h"
#include "tests/support/kernel_check.h"

namespace strata::testing {

// The bytes of any tensor, copied to the host.
inline std::vector<unsigned char> tensor_bytes(const tensor::Tensor& t) {
  const tensor::Tensor h = t.contiguous().to(Device::cpu());
  std::vector<unsigned char> b(static_cast<size_t>(h.numel()) * dtype_size(h.dtype()));
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

inline void expect_norm_grads_added_into(Device device, DType dt) {
  using namespace tensor;
  const int64_t n = 37, c = 24;
  uint64_t stream = 4200;
  auto rnd = [&](const Shape& s) {
    return make_tensor(random_normal(static_cast<size_t>(s.numel()), ++stream), s)
        .to(dt)
        .to(device);
  };
  const Tensor x = rnd({n, c}), r = rnd({n, c}), dy = rnd({n, c}), ds = rnd({n, c});
  const Tensor w = rnd({c}), b = rnd({c}), old_w = rnd({c}), old_b = rnd({c});
  // What AccumulateGrad makes of a returned gradient g in a buffer holding `old`.
  auto accumulated = [](const Tensor& old, const Tensor& g) {
    Tensor out = old.clone();
    axpy_(1.f, g, out);
    return out;
  };
  // Runs `backward` with and without `into`, for a norm with or without bias.
  auto check = [&](const char* what, bool with_bias, auto backward) {
    SCOPED_TRACE(what);
    NormGradsInto into{old_w.clone(), with_bias ? old_b.clone() : Tensor()};
    const Tensor buffer_w = into.dweight, buffer_b = into.dbias;
    const auto plain = backward(nullptr);
    const auto added = backward(&into);
    EXPECT_TRUE(tensor_bytes(added.dx) == tensor_bytes(plain.dx)) << "dx";
    EXPECT_TRUE(tensor_bytes(buffer_w) == tensor_bytes(accumulated(old_w, plain.dweight)))
        << "dweight added into its buffer";
    EXPECT_FALSE(tensor_bytes(buffer_w) == tensor_bytes(old_w)) << "nothing was added";
    EXPECT_EQ(added.dweight.data_ptr(), buffer_w.data_ptr());
    if constexpr (requires { plain.dbias; }) {
      EXPECT_TRUE(tensor_bytes(buffer_b) == tensor_bytes(accumulated(old_b, plain.dbias)))
          << "dbias added into its buffer";
      EXPECT_EQ(added.dbias.data_ptr(), buffer_b.data_ptr());
    }
  };
  const float eps = 1e-5f;
  const NormResult ln = layernorm(x, w, b, eps);
  check("layernorm", true, [&](const NormGradsInto* into) {
    return layernorm_backward(dy, x, w, ln.mean, ln.rstd, into);
  });
  const NormResult rn = rmsnorm(x, w, eps);
  check("rmsnorm", false,
        [&](const NormGradsInto* into) { return rmsnorm_backward(dy, x, w, rn.rstd, into); });
  const AddNormResult al = add_layernorm(x, r, w, b, eps);
  for (const Tensor& g : {ds, Tensor()}) {
    check(g.defined() ? "add_layernorm with ds" : "add_layernorm", true,
          [&](const NormGradsInto* into) {
            return add_layernorm_backward(dy, g, al.s, w, al.mean, al.rstd, into);
          });
  }
  const AddNormResult ar = add_rmsnorm(x, r, w, eps);
  for (const Tensor& g : {ds, Tensor()}) {
    check(g.defined() ? "add_rmsnorm with ds" : "add_rmsnorm", false,
          [&](const NormGradsInto* into) {
            return add_rmsnorm_backward(dy, g, ar.s, w, ar.rstd, into);
          });
  }
  // Buffers that cannot take the gradients are refused before anything runs.
  const Tensor other = dt == DType::F32 ? rnd({c}).to(DType::BF16) : rnd({c}).to(DType::F32);
  const NormGradsInto wrong_dtype{other, b.clone()}, wrong_shape{rnd({c + 1}), b.clone()},
      missing_bias{w.clone(), Tensor()}, bias_for_rms{w.clone(), b.clone()};
  EXPECT_THROW(layernorm_backward(dy, x, w, ln.mean, ln.rstd, &wrong_dtype), InternalError);
  EXPECT_THROW(layernorm_backward(dy, x, w, ln.mean, ln.rstd, &wrong_shape), InternalError);
  EXPECT_THROW(layernorm_backward(dy, x, w, ln.mean, ln.rstd, &missing_bias), InternalError);
  EXPECT_THROW(rmsnorm_backward(dy, x, w, rn.rstd, &bias_for_rms), InternalError);
}

}  // namespace strata::testing
