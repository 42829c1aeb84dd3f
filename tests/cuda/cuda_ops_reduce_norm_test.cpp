// CUDA backend vs the CPU backend: the reductions (sums of squares, top-k, column sums over
// many row chunks, sum_to) and the norms' backward paths, kernel by kernel. Skips itself when
// no GPU is visible (CTest label `cuda`).
#include "tests/cuda/cuda_ops_test_util.h"

namespace strata::tensor {
namespace {

using namespace cuda_ops_test;

// sum_squares_many: one total per tensor, copied back alone (an empty tensor's is 0), from
// launches that share one region of block partials in stream order; a large tensor takes many
// blocks, a small one one.
TEST(CudaOps, SumSquaresManyGivesEachTensorItsTotal) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> cpu = {rnd({600001}, 80), Tensor::empty({0}, DType::F32),
                                   rnd({3, 5}, 81).to(DType::BF16),
                                   rnd({300000}, 82).to(DType::F16), rnd({7}, 83)};
  std::vector<Tensor> gpu;
  for (const Tensor& t : cpu) gpu.push_back(t.to(kGpu));
  const std::vector<double> got = sum_squares_many(gpu);
  ASSERT_EQ(got.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double want = sum_squares(cpu[i]);
    EXPECT_NEAR(got[i], want, 1e-12 * want) << "tensor " << i;
    EXPECT_EQ(got[i], sum_squares(gpu[i])) << "tensor " << i;  // alone: the same blocks, bits
  }
  EXPECT_EQ(got[1], 0.0);
  // More tensors than one group of rows holds (64): three groups, empty tensors at their edges.
  std::vector<Tensor> many_cpu, many_gpu;
  for (int i = 0; i < 150; ++i) {
    const int64_t len = i == 63 || i == 64 || i == 128 ? 0 : 1 + (i * 7919) % 5000;
    many_cpu.push_back(rnd({len}, 100 + static_cast<uint64_t>(i)));
    many_gpu.push_back(many_cpu.back().to(kGpu));
  }
  const std::vector<double> many = sum_squares_many(many_gpu);
  ASSERT_EQ(many.size(), many_cpu.size());
  for (size_t i = 0; i < many.size(); ++i) {
    const double want = sum_squares(many_cpu[i]);
    EXPECT_NEAR(many[i], want, 1e-12 * want) << "tensor " << i;
    EXPECT_EQ(many[i], sum_squares(many_gpu[i])) << "tensor " << i;
  }
}

// Note [CUDA top-k]: the kernel's elements and order are the CPU backend's (Note [Top-k]), bit
// for bit, on rows without ties (f32) and with ties straddling the cut (rounded values, and bf16's
// coarse grid), a strided slice of padded rows (a sampler's logits), signed zeros, infinities and
// NaN, k = 1 (greedy) to the kernel's limit, and past it (the host path).
TEST(CudaOps, TopKSelectsTheCpusElementsInTheCpusOrder) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> special(300);
  for (size_t i = 0; i < special.size(); ++i) special[i] = static_cast<float>(i % 7) - 3.f;
  for (size_t i : {5u, 77u, 200u}) special[i] = nan;
  for (size_t i : {9u, 150u}) special[i] = INFINITY;
  for (size_t i : {10u, 11u, 299u}) special[i] = -INFINITY;
  for (size_t i : {20u, 40u, 60u}) special[i] = -0.f;
  std::vector<float> coarse = to_float_vector(rnd({4, 777}, 60, -5.f, 5.f));
  for (float& v : coarse) v = std::round(v);
  std::vector<float> coarse_wide = to_float_vector(rnd({2, 20000}, 66));
  for (float& v : coarse_wide) v = std::round(v * 8.f) / 8.f;
  const Tensor padded = rnd({3, 1100}, 61);
  // Rows of one value: all -inf, all NaN, zeros of both signs (ties everywhere).
  std::vector<float> flat(3 * 70, -INFINITY);
  for (size_t i = 70; i < 140; ++i) flat[i] = nan;
  for (size_t i = 140; i < 210; ++i) flat[i] = i % 3 == 0 ? -0.f : 0.f;
  // Each case's rows in dtype dt on device d (cast on the host, so a NaN's bits are the same on
  // both devices).
  struct Rows {
    std::function<Tensor(Device, DType)> on;
    std::vector<int64_t> ks;
  };
  const auto plain = [](Tensor x) { return [x](Device d, DType dt) { return x.to(dt).to(d); }; };
  const std::vector<Rows> cases = {
      {plain(rnd({3, 5000}, 62)), {1, 40, 1024}},
      {plain(from_vector(coarse, {4, 777})), {1, 5, 300, 777}},
      // The sampler's view: padded rows, the vocabulary's columns.
      {[padded](Device d, DType dt) { return padded.to(dt).to(d).narrow(1, 0, 1037); }, {40}},
      {plain(from_vector(special, {1, 300})), {1, 3, 12, 300}},
      {plain(from_vector(flat, {3, 70})), {1, 2}},
      {plain(rnd({2, 2000}, 63)), {1500}},  // past kTopKMax: the host path
      // GPT-2's vocabulary: several tiles of the kernel's passes.
      {plain(rnd({2, 50257}, 65)), {1, 40}},
      // Ties across several tiles of the in-order walk.
      {plain(from_vector(coarse_wide, {2, 20000})), {3, 1000}},
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Rows& c : cases) {
      for (int64_t k : c.ks) {
        const Tensor x = c.on(Device::cpu(), dt);
        SCOPED_TRACE(x.str() + " k " + std::to_string(k));
        const TopKResult want = top_k(x, k);
        const Tensor xd = c.on(kGpu, dt);
#if defined(STRATA_CUDA_EMULATION)
        const uint64_t before = cuda_emu::launches_of("top_k_kernel"),
                       before_1 = cuda_emu::launches_of("top_1_kernel");
#endif
        const TopKResult got = top_k(xd, k);
#if defined(STRATA_CUDA_EMULATION)
        // k = 1 reads the row once (Note [CUDA top-k]); k above kTopKMax goes to the host.
        EXPECT_EQ(cuda_emu::launches_of("top_k_kernel") - before,
                  k > 1 && k <= cuda::kTopKMax ? 1u : 0u);
        EXPECT_EQ(cuda_emu::launches_of("top_1_kernel") - before_1, k == 1 ? 1u : 0u);
#endif
        EXPECT_EQ(to_int_vector(got.indices), to_int_vector(want.indices));
        const Tensor gv = got.values.to(Device::cpu());
        ASSERT_EQ(gv.dtype(), dt);
        EXPECT_EQ(std::memcmp(gv.data_ptr(), want.values.data_ptr(), want.values.nbytes()), 0);
      }
    }
  }
  // Greedy: k = 1 is max's argmax on rows without NaN.
  const Tensor y = rnd({5, 3000}, 64).to(kGpu);
  EXPECT_EQ(to_int_vector(top_k(y, 1).indices.view({5})), to_int_vector(max(y, 1).indices));
}

// Note [Row chunks on grid.y] (tensor/cuda/common.cuh): the column reductions give a chunk of
// rows a blockIdx.y, which holds at most 65535. One column of more rows than 65535 chunks (plus a
// partial last chunk) through each of them: the bias-gradient sum (sum_to), the linear
// epilogue's column sums and the norm weight/bias gradients. Values 0 and 1 make every partial
// and total an integer below 2^24, exact in f32 in any order, so the sums must be exact.
TEST(CudaOps, ColumnReductionsTakeMoreRowChunksThanGridYHolds) {
  SKIP_WITHOUT_GPU();
  const auto column = [](int64_t n, int64_t& ones_count) {
    std::vector<float> v(static_cast<size_t>(n));
    ones_count = 0;
    for (int64_t r = 0; r < n; ++r) {
      v[static_cast<size_t>(r)] = (r * 7 + r / 3) % 5 < 2 ? 1.f : 0.f;
      ones_count += v[static_cast<size_t>(r)] == 1.f;
    }
    return from_vector(v, {n, 1}).to(kGpu);
  };
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  const auto f32 = static_cast<int>(DType::F32);
  {
    int64_t want = 0;
    const int64_t n = 65537 * cuda::kColumnSumRows + 5;
    const Tensor x = column(n, want);
    EXPECT_EQ(sum_to(x, {1}).to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  }
  int64_t want = 0;
  const int64_t n = 65537 * cuda::kNormRowChunk + 5;
  const int64_t chunks = (n + cuda::kNormRowChunk - 1) / cuda::kNormRowChunk;
  const Tensor x = column(n, want);
  Tensor scratch = zeros({2 * chunks}, DType::F32, kGpu);
  Tensor out = zeros({1}, DType::F32, kGpu);
  ASSERT_TRUE(cuda::launch_column_sums(f32, x.data_ptr(), f32, out.data_ptr(),
                                       scratch.data<float>(), n, 1, stream));
  EXPECT_EQ(out.to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  // dweight = sum dy * (x - mean) * rstd with dy = 1, mean = 0, rstd = 1: the count of ones;
  // dbias = sum dy = n.
  const Tensor dy = ones({n, 1}, DType::F32, kGpu);
  const Tensor mean = zeros({n}, DType::F32, kGpu);
  const Tensor rstd = ones({n}, DType::F32, kGpu);
  Tensor dw = zeros({1}, DType::F32, kGpu), db = zeros({1}, DType::F32, kGpu);
  ASSERT_TRUE(cuda::launch_norm_param_grads(f32, dy.data_ptr(), x.data_ptr(), mean.data<float>(),
                                            rstd.data<float>(), dw.data_ptr(), db.data_ptr(),
                                            scratch.data<float>(), n, 1, false, stream));
  EXPECT_EQ(dw.to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  EXPECT_EQ(db.to(Device::cpu()).data<float>()[0], static_cast<float>(n));
}

// Note [Chunk partial sums] (tensor/cuda/common.cuh): the column sums add each chunk's rows in
// row order, the chunks in 32 contiguous runs of ceil(chunks / 32), and the runs in order, all in
// f32. Values of many magnitudes make the order show in the bits; the host adds in that order and
// the GPU must give the same bits, for a chunk count that leaves the last runs short or empty.
TEST(CudaOps, ColumnSumsAddChunkPartialsInTheirNotedOrder) {
  SKIP_WITHOUT_GPU();
  const int64_t c = 37, chunks = 32 * 3 + 7, n = (chunks - 1) * cuda::kNormRowChunk + 5;
  std::vector<float> x(static_cast<size_t>(n * c));
  uint64_t state = 12345;
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto bits = static_cast<uint32_t>(state >> 33);
    v = static_cast<float>(static_cast<int>(bits % 2001) - 1000) *
        std::ldexp(1.f, static_cast<int>(bits >> 20) % 24 - 12);
  }
  std::vector<float> want(static_cast<size_t>(c));
  const int64_t per_run = (chunks + 31) / 32;
  // The chunks one after another differ somewhere, or the test could not tell the orders apart.
  bool order_shows = false;
  for (int64_t j = 0; j < c; ++j) {
    std::vector<float> partial(static_cast<size_t>(chunks));
    for (int64_t k = 0; k < chunks; ++k) {
      float p = 0;
      for (int64_t r = k * cuda::kNormRowChunk; r < std::min(n, (k + 1) * cuda::kNormRowChunk); ++r)
        p += x[static_cast<size_t>(r * c + j)];
      partial[static_cast<size_t>(k)] = p;
    }
    float total = 0, chunk_by_chunk = 0;
    for (int64_t y = 0; y < 32; ++y) {
      float run = 0;
      for (int64_t k = y * per_run; k < std::min(chunks, (y + 1) * per_run); ++k)
        run += partial[static_cast<size_t>(k)];
      total += run;
    }
    for (float p : partial) chunk_by_chunk += p;
    want[static_cast<size_t>(j)] = total;
    order_shows = order_shows || chunk_by_chunk != total;
  }
  ASSERT_TRUE(order_shows);
  const Tensor xg = from_vector(x, {n, c}).to(kGpu);
  Tensor scratch = zeros({chunks * c}, DType::F32, kGpu);
  Tensor out = zeros({c}, DType::F32, kGpu);
  const auto f32 = static_cast<int>(DType::F32);
  ASSERT_TRUE(cuda::launch_column_sums(f32, xg.data_ptr(), f32, out.data_ptr(),
                                       scratch.data<float>(), n, c,
                                       static_cast<cuda::Stream>(cuda_current_stream())));
  const Tensor got = out.to(Device::cpu());
  for (int64_t j = 0; j < c; ++j)
    EXPECT_EQ(got.data<float>()[j], want[static_cast<size_t>(j)]) << "column " << j;
}

// Note [Fused norm weight gradients] (tensor/cuda/norm.cu): the norm backward's one-kernel
// path (dsum and the weight/bias partials in one pass) gives the bits of the two-kernel path, for
// layernorm and rmsnorm, with and without the residual's ds, in every float dtype: rows of packs
// with a short last chunk, rows that take no packs, a single row, and rows of 512 packs (the
// largest block the fused path takes). In the emulator it also checks which kernels ran.
// Note [Norm gradients into their buffer] (tensor/ops.h): with `accumulate`, both paths add
// dweight and dbias into buffers that already hold gradients, with the bits tensor::axpy_ (what
// AccumulateGrad runs) gives adding the returned gradients into the same buffers.
TEST(CudaOps, FusedNormBackwardGivesTheSeparatePathsBits) {
  SKIP_WITHOUT_GPU();
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  auto bytes = [](const Tensor& t) {
    const Tensor h = t.to(Device::cpu());
    const auto* p = static_cast<const unsigned char*>(h.data_ptr());
    return std::vector<unsigned char>(p,
                                      p + h.numel() * static_cast<int64_t>(dtype_size(h.dtype())));
  };
  uint64_t draw = 900;
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const auto pack = static_cast<int64_t>(16 / dtype_size(dt));
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {75, 8 * pack}, {70, 37}, {1, pack}, {40, 512 * pack}};
    for (const auto& [n, c] : shapes)
      for (const bool layer : {true, false})
        for (const bool with_ds : {false, true}) {
          SCOPED_TRACE(dtype_tag(dt) + " n=" + std::to_string(n) + " c=" + std::to_string(c) +
                       (layer ? " layernorm" : " rmsnorm") + (with_ds ? " with ds" : ""));
          const Tensor dy = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor x = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor ds = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor w = rnd({c}, ++draw).to(dt).to(kGpu);
          const Tensor mean = rnd({n}, ++draw, -0.5f, 0.5f).to(kGpu);
          const Tensor rstd = rnd({n}, ++draw, 0.5f, 2.f).to(kGpu);
          const int64_t chunks = (n + cuda::kNormRowChunk - 1) / cuda::kNormRowChunk;
          std::vector<std::vector<unsigned char>> got[2];
          for (const bool fused : {false, true}) {
            Tensor dsum = zeros({n, c}, dt, kGpu), dw = zeros({c}, dt, kGpu),
                   db = zeros({c}, dt, kGpu);
            Tensor scratch = zeros({2 * chunks * c}, DType::F32, kGpu);
#if defined(STRATA_CUDA_EMULATION)
            cuda_emu::reset_launch_sites();
#endif
            ASSERT_TRUE(cuda::launch_norm_backward(
                static_cast<int>(dt), dy.data_ptr(), with_ds ? ds.data_ptr() : nullptr,
                x.data_ptr(), w.data_ptr(), layer ? mean.data<float>() : nullptr,
                rstd.data<float>(), dsum.data_ptr(), dw.data_ptr(), layer ? db.data_ptr() : nullptr,
                scratch.data<float>(), n, c, fused, false, stream));
#if defined(STRATA_CUDA_EMULATION)
            uint64_t fused_launches = 0, partial_launches = 0;
            for (const cuda_emu::LaunchSite& site : cuda_emu::launch_sites()) {
              if (site.kernel.find("add_norm_bwd_fused") != std::string::npos)
                fused_launches += site.launches;
              if (site.kernel.find("norm_bwd_partials") != std::string::npos)
                partial_launches += site.launches;
            }
            EXPECT_EQ(fused_launches, fused ? 1u : 0u);
            EXPECT_EQ(partial_launches, fused ? 0u : 1u);
#endif
            got[fused] = {bytes(dsum), bytes(dw), bytes(db)};
            // The same backward adding into buffers holding earlier gradients.
            const Tensor old_w = rnd({c}, draw + 100).to(dt).to(kGpu);
            const Tensor old_b = rnd({c}, draw + 200).to(dt).to(kGpu);
            Tensor want_w = old_w.clone(), want_b = old_b.clone();
            axpy_(1.f, dw, want_w);
            axpy_(1.f, db, want_b);
            Tensor acc_w = old_w.clone(), acc_b = old_b.clone(), acc_sum = zeros({n, c}, dt, kGpu);
            ASSERT_TRUE(cuda::launch_norm_backward(
                static_cast<int>(dt), dy.data_ptr(), with_ds ? ds.data_ptr() : nullptr,
                x.data_ptr(), w.data_ptr(), layer ? mean.data<float>() : nullptr,
                rstd.data<float>(), acc_sum.data_ptr(), acc_w.data_ptr(),
                layer ? acc_b.data_ptr() : nullptr, scratch.data<float>(), n, c, fused, true,
                stream));
            EXPECT_TRUE(bytes(acc_sum) == bytes(dsum)) << "dsum with accumulate";
            EXPECT_TRUE(bytes(acc_w) == bytes(want_w)) << "dweight added into a buffer";
            EXPECT_TRUE(bytes(acc_b) == bytes(layer ? want_b : old_b))
                << (layer ? "dbias added into a buffer" : "rmsnorm left dbias's buffer alone");
            EXPECT_TRUE(bytes(acc_w) != bytes(old_w)) << "nothing was added";
          }
          const char* names[] = {"dsum", "dweight", "dbias"};
          for (int i = 0; i < 3; ++i) EXPECT_TRUE(got[0][i] == got[1][i]) << names[i];
        }
  }
}

// Note [Norm gradients into their buffer] through the ops, as autograd's norms call them: the
// buffers end with the bits AccumulateGrad's axpy of the returned gradients gives (the launcher
// test above covers the separate path too).
TEST(CudaOps, NormGradientsAddIntoGivenBuffersWithTheAxpysBits) {
  SKIP_WITHOUT_GPU();
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    strata::testing::expect_norm_grads_added_into(kGpu, dt);
  }
}

// Note [CUDA column sums]: sum_to over a few leading rows of many columns (GPT-2 1558M's
// position-embedding gradient: 16 rows of 1.6M) takes the column kernels too, where the generic
// reduce gave each column a block. The values (22-bit integers / 4096) add exactly in f64, so
// every column must be its exact sum rounded once; which kernels ran, bench_gpt2_cuda --launches
// shows (no reduce_kernel of 1.6M blocks in a 1558M step).
TEST(CudaOps, SumToOverFewRowsOfManyColumnsIsTheRowOrderSum) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5, c = 40000;
  std::vector<float> x(static_cast<size_t>(n * c));
  uint64_t state = 777;
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / 4096.f;
  }
  const Tensor got = sum_to(from_vector(x, {n, c}).to(kGpu), {c}).to(Device::cpu());
  for (int64_t j = 0; j < c; ++j) {
    double want = 0;
    for (int64_t r = 0; r < n; ++r) want += x[static_cast<size_t>(r * c + j)];
    ASSERT_EQ(got.data<float>()[j], static_cast<float>(want)) << "column " << j;
  }
}

}  // namespace
}  // namespace strata::tensor
