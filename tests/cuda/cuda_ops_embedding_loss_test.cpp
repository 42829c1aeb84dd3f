// CUDA backend vs the CPU backend: cross-entropy (in place, fused), the embedding backward's
// device sort, and bad token ids reported at the next wait (Note [Deferred device checks]).
// Skips itself when no GPU is visible (CTest label `cuda`).
#include "tests/cuda/cuda_ops_test_util.h"

namespace strata::tensor {
namespace {

using namespace cuda_ops_test;

// Note [Logits gradient in place]: the cross-entropy backward written over the logits gives the
// out-of-place kernel's bits, on aligned rows (128-bit packs read and written in place) and on
// rows one element off (the one-element path), with padding columns and an ignored row.
TEST(CudaOps, CrossEntropyBackwardInPlaceGivesTheOutOfPlaceBits) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 13, ld = 264, classes = 250;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -100 : (i * 37) % classes;
  const Tensor targets = from_ints(t, {n}).to(kGpu);
  const Tensor dloss = rnd({n}, 71).to(kGpu);
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_tag(dt));
    const Tensor x = rnd({n, ld}, 70, -6.f, 6.f).to(dt);
    const CrossEntropyResult r = cross_entropy(x.to(kGpu), targets, -100, classes);
    const Tensor want =
        cross_entropy_backward(x.to(kGpu), targets, r.lse, dloss, -100, classes).to(Device::cpu());
    for (bool aligned : {true, false}) {
      SCOPED_TRACE(aligned ? "aligned" : "shifted");
      Tensor g = aligned ? x.to(kGpu) : shifted_on_gpu(x);
      const void* at = g.data_ptr();
      cross_entropy_backward_(g, targets, r.lse, dloss, -100, classes);
      EXPECT_EQ(g.data_ptr(), at);
      EXPECT_EQ(max_abs_diff(g.to(Device::cpu()).to(DType::F32), want.to(DType::F32)), 0.0);
    }
  }
}

// Note [CUDA fused cross-entropy]: one kernel gives the forward's losses and lse and leaves the
// backward's gradient (dloss = grad / m) in the logits, with the two kernels' bits, on aligned
// rows and on rows one element off, with padding columns and an ignored row; a bad target is a
// UserError at the next wait. scale_unless_equal_ decides on the device: equal leaves the bits,
// different rescales them as affine does.
TEST(CudaOps, FusedCrossEntropyGivesTheTwoKernelsBits) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 13, ld = 264, classes = 250;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -100 : (i * 37) % classes;
  const Tensor targets = from_ints(t, {n}).to(kGpu);
  auto host = [](const Tensor& v) { return v.to(Device::cpu()).to(DType::F32); };
  for (DType dt : kDtypes) {
    for (float grad : {1.f, 1024.f / 3.f}) {
      const Tensor x = rnd({n, ld}, 72, -6.f, 6.f).to(dt);
      const Tensor g = full({}, grad, DType::F32, kGpu);
      // The row's split among threads differs between the 128-bit and one-element paths, so
      // each layout is compared with the unfused kernels on the same layout.
      for (bool aligned : {true, false}) {
        SCOPED_TRACE(dtype_tag(dt) + " grad " + std::to_string(grad) +
                     (aligned ? " aligned" : " shifted"));
        auto layout = [&] { return aligned ? x.to(kGpu) : shifted_on_gpu(x); };
        const Tensor xl = layout();
        const CrossEntropyResult want = cross_entropy(xl, targets, -100, classes);
        const Tensor dloss = div(g, want.norm.narrow(0, 0, 1).reshape({})).reshape({1}).expand({n});
        const Tensor dx = cross_entropy_backward(xl, targets, want.lse, dloss, -100, classes);
        Tensor l = layout();
        const CrossEntropyResult got = cross_entropy_fused_(l, targets, grad, -100, classes);
        EXPECT_EQ(max_abs_diff(host(got.losses), host(want.losses)), 0.0);
        EXPECT_EQ(max_abs_diff(host(got.lse), host(want.lse)), 0.0);
        EXPECT_EQ(max_abs_diff(host(got.norm), host(want.norm)), 0.0);
        EXPECT_EQ(max_abs_diff(host(l), host(dx)), 0.0);
        Tensor same = dx.clone(), other = dx.clone();
        scale_unless_equal_(same, g, grad);
        scale_unless_equal_(other, g, 2.f * grad + 1.f);
        EXPECT_EQ(max_abs_diff(host(same), host(dx)), 0.0);
        EXPECT_EQ(max_abs_diff(host(other), host(affine(dx, grad / (2.f * grad + 1.f), 0.f))), 0.0);
      }
    }
  }
  Tensor bad = rnd({2, 10}, 73).to(kGpu);
  EXPECT_THROW(
      {
        cross_entropy_fused_(bad, from_ints({1, 12}, {2}).to(kGpu), 1.f, -100, 10);
        (void)bad.to(Device::cpu());
      },
      UserError);
}

// Note [CUDA fused cross-entropy]: keeping each thread's packs in registers between the passes
// only changes where the second pass reads them from, so the register cache on and off give the
// same losses, lse and gradient bits, and both give the unfused kernels' bits. Rows whose
// vocabulary is not a multiple of the pack (a scalar tail, a pack that straddles v), padding
// columns, an ignored row, targets in the first pack, the tail and the last column, rows one
// element off (no packs), GPT-2's row (50257 of 50304: cached in bf16/f16, too wide for the cache
// in f32) and f32 rows just inside and just past the cache. In the emulator it also checks which
// kernel ran.
TEST(CudaOps, FusedCrossEntropyRowCacheGivesTheSameBits) {
  SKIP_WITHOUT_GPU();
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  auto bytes = [](const Tensor& t) {
    const Tensor h = t.to(Device::cpu());
    const auto* p = static_cast<const unsigned char*>(h.data_ptr());
    return std::vector<unsigned char>(p,
                                      p + h.numel() * static_cast<int64_t>(dtype_size(h.dtype())));
  };
  const int64_t f32_cached = int64_t{cuda::kCeCachePacks} * 1024 * 4;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {264, 250}, {50304, 50257}, {f32_cached, f32_cached}, {f32_cached + 8, f32_cached + 4}};
  uint64_t draw = 600;
  for (const DType dt : kDtypes) {
    for (const auto& [ld, v] : shapes) {
      const int64_t n = 5;
      const Tensor targets = from_ints({v - 1, -100, 0, v / 2, v - 9}, {n}).to(kGpu);
      const Tensor x = rnd({n, ld}, ++draw, -6.f, 6.f).to(dt);
      const bool fits = cuda::ce_row_cache_fits(v, static_cast<int>(dtype_size(dt)));
      for (const bool aligned : {true, false}) {
        SCOPED_TRACE(dtype_tag(dt) + " ld=" + std::to_string(ld) + " v=" + std::to_string(v) +
                     (aligned ? " aligned" : " shifted"));
        auto layout = [&] { return aligned ? x.to(kGpu) : shifted_on_gpu(x); };
        const float grad = 0.75f;
        const Tensor norm = from_vector({3.f, 1.f / 3.f}, {2}).to(kGpu);
        const Tensor xl = layout();
        const CrossEntropyResult want = cross_entropy(xl, targets, -100, v);
        const Tensor dloss = full({n}, grad / 3.f, DType::F32, kGpu);
        const Tensor dx = cross_entropy_backward(xl, targets, want.lse, dloss, -100, v);
        for (const bool cache : {true, false}) {
          SCOPED_TRACE(cache ? "row cache" : "no row cache");
          Tensor l = layout();
          Tensor losses = zeros({n}, DType::F32, kGpu), lse = zeros({n}, DType::F32, kGpu);
          Tensor bad = zeros({1}, DType::I32, kGpu);
#if defined(STRATA_CUDA_EMULATION)
          cuda_emu::reset_launch_sites();
#endif
          ASSERT_TRUE(cuda::launch_cross_entropy_fused(
              static_cast<int>(dt), l.data_ptr(), targets.data_ptr(), true, -100,
              losses.data<float>(), lse.data<float>(), n, ld, v, bad.data<int>(), grad,
              norm.data<float>(), cache, stream));
#if defined(STRATA_CUDA_EMULATION)
          uint64_t cached_launches = 0;
          for (const cuda_emu::LaunchSite& site : cuda_emu::launch_sites())
            if (site.kernel.find("ce_fused<T, kCeCachePacks>") != std::string::npos)
              cached_launches += site.launches;
          EXPECT_EQ(cached_launches, cache && fits ? 1u : 0u);
#endif
          EXPECT_EQ(bad.to(Device::cpu()).data<int>()[0], 0);
          EXPECT_TRUE(bytes(losses) == bytes(want.losses)) << "losses";
          EXPECT_TRUE(bytes(lse) == bytes(want.lse)) << "lse";
          EXPECT_TRUE(bytes(l) == bytes(dx)) << "gradient";
        }
      }
    }
  }
}

// Note [CUDA embedding backward]: the device sort (tiles of 2048 keys, global merge passes above
// that) must give each id its rows in row order, so the sums are the CPU's bits: f32, and bf16
// rounded once from the same f32 sums. Sizes around the tile and past two merge stages, ids from
// a small vocabulary (runs of hundreds of rows: the unrolled walk), I32 and I64 ids, a dweight
// that is not zero, and widths of one and two column blocks.
TEST(CudaOps, EmbeddingBackwardSortsOnTheDeviceWithTheCpusBits) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 3, 2047, 2048, 2049, 5000}) {
    for (int64_t c : {24, 200}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        for (DType it : {DType::I64, DType::I32}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c << " " << dtype_tag(dt)
                                            << (it == DType::I32 ? " i32" : " i64"));
          const int64_t vocab = 37;
          std::vector<int64_t> ids(static_cast<size_t>(n));
          uint64_t x = 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(n * 131 + c);
          for (int64_t& id : ids) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            // Skewed: id 5 about half the time (one long run), the rest spread.
            id = (x >> 40) % 2 == 0 ? 5 : static_cast<int64_t>((x >> 33) % vocab);
          }
          const Tensor cpu_ids = from_ints(ids, {n}, it);
          const Tensor dout = rnd({n, c}, 40).to(dt);
          const Tensor start = rnd({vocab, c}, 41).to(dt);
          Tensor want = start.clone();
          embedding_backward(cpu_ids, dout, want);
          Tensor got = start.to(kGpu);
          embedding_backward(cpu_ids.to(kGpu), dout.to(kGpu), got);
          EXPECT_EQ(max_abs_diff(got.to(Device::cpu()).to(DType::F32), want.to(DType::F32)), 0.0);
        }
      }
    }
  }
}

// Note [Deferred device checks]: a bad id or target is reported at the next wait for the device
// (here a copy to the host) with the message of the op that met it, the kernels stay in bounds,
// and the next wait after the error is clean.
TEST(CudaOps, BadTokenIdsAreUserErrorsAtTheNextWait) {
  SKIP_WITHOUT_GPU();
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no UserError)";
  };
  const auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  const Tensor cpu_w = arange(40).reshape({10, 4});
  const Tensor w = cpu_w.to(kGpu);
  const Tensor bad_ids = from_ints({1, 10}, {2}).to(kGpu);
  Tensor looked_up;
  EXPECT_PRED2(has, message([&] {
                 looked_up = embedding(w, bad_ids);
                 looked_up.to(Device::cpu());
               }),
               "embedding: a token id is outside [0, 10)");
  // The good row is still looked up, the bad one reads 0.
  const Tensor host = looked_up.to(Device::cpu());
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(host.data<float>()[c], cpu_w.data<float>()[4 + c]);
    EXPECT_EQ(host.data<float>()[4 + c], 0.f);
  }
  EXPECT_PRED2(has, message([&] {
                 cross_entropy(zeros({2, 10}, DType::F32, kGpu), from_ints({1, 12}, {2}).to(kGpu),
                               -100)
                     .losses.to(Device::cpu());
               }),
               "cross_entropy: a target is outside [0, 10)");
  Tensor dw = zeros({10, 4}, DType::F32, kGpu);
  EXPECT_PRED2(has, message([&] {
                 embedding_backward(bad_ids, ones({2, 4}, DType::F32, kGpu), dw);
                 dw.to(Device::cpu());
               }),
               "embedding_backward: a token id is outside [0, 10)");
  const Tensor dw_host = dw.to(Device::cpu());  // the good id's row was added, nothing else
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(dw_host.data<float>()[i], i / 4 == 1 ? 1.f : 0.f);
  // Two bad launches before one wait: the first one's message.
  EXPECT_PRED2(has, message([&] {
                 embedding(w, bad_ids);
                 cross_entropy(zeros({2, 10}, DType::F32, kGpu), from_ints({1, 12}, {2}).to(kGpu),
                               -100)
                     .losses.to(Device::cpu());
               }),
               "embedding: a token id");
  // Nothing is left over for the next wait.
  EXPECT_NO_THROW(embedding(w, from_ints({3, 9}, {2}).to(kGpu)).to(Device::cpu()));
  // Flags for 64 launches: with a bad one among them and no wait, the 65th launch waits first
  // and raises.
  const Tensor good_ids = from_ints({3, 9}, {2}).to(kGpu);
  int launches = 0;
  EXPECT_PRED2(has, message([&] {
                 embedding(w, bad_ids);
                 for (launches = 1; launches < 100; ++launches) embedding(w, good_ids);
               }),
               "embedding: a token id is outside [0, 10)");
  EXPECT_EQ(launches, 64);
  EXPECT_NO_THROW(embedding(w, good_ids).to(Device::cpu()));
}

}  // namespace
}  // namespace strata::tensor
