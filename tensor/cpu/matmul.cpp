// CPU matmul: oneDNN when built with it, Eigen's GEMM kernel otherwise (or when asked).
//
// Note [Matmul determinism]
// Both engines give the same bits for the same inputs run after run; the Eigen engine also
// gives the same bits whatever the thread count, oneDNN only for a fixed thread count:
//   - Eigen: the output is cut into fixed tiles (kTileM x kTileN per batch item) and each tile is
//     one single-threaded Eigen GEMM, so threads only decide who computes which tile. Eigen's
//     own OpenMP splitting is avoided on purpose: it changes the K blocking with the number of
//     threads, hence the rounding. That is why the tile product calls Eigen's GEMM kernel
//     (general_matrix_matrix_product, as Eigen's own product evaluator does) with single-thread
//     blocking rather than going through `Map * Map`.
//   - oneDNN: primitives are built once per (shape, transposes, dtypes, alpha, beta, threads)
//     and reused; oneDNN splits work statically, so a given thread count always sums in the same
//     order. Its GEMM may split K across threads for some shapes, so a different thread count can
//     round differently. The primitive is run from the calling thread, never inside an OpenMP
//     region: oneDNN sizes its thread split when the primitive is built and would only run the
//     first share of it in a nested region. A call made inside a parallel region therefore
//     takes the Eigen engine.
// BF16 inputs use oneDNN's bf16 kernels where the CPU has a real (non-reference) one; otherwise
// they, and F16 inputs always, are widened to f32 (exactly) and take the f32 path, with the f32
// result rounded once when the output is BF16/F16 (Note [Widening adapter]).
//
// Note [No AMX for bf16 matmul]
// On CPUs with AMX (Sapphire Rapids and later), oneDNN 2.6 (Debian's libdnnl2) picks its AMX
// kernel, brg:avx512_core_amx_bf16, for bf16 matmuls, and that kernel returns wrong sums: for
// every output width N from 49 to 63 with B transposed (errors of 10 to 90 on values of 50), and
// now and then with B as it is, differing from run to run (seen with a plain oneDNN program too,
// no Strata code involved). So Strata caps oneDNN at AVX512_CORE_BF16 before its first kernel
// (dnnl::set_max_cpu_isa; not where ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA sets a cap of the
// user's), whose bf16 kernels agree with the f32 product on every width, and refuses any AMX
// implementation that still comes up (the cap can fail, e.g. in a oneDNN built without it, or
// the user's may allow AMX): that problem is widened to f32 instead.
// Matmul.Bf16EveryOutputWidthMatchesTheF32Product checks widths 1 to 130.
#include "tensor/cpu/matmul.h"

#include <omp.h>

#include <Eigen/Core>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/strided.h"
#include "tensor/cpu/widen.h"

#if defined(STRATA_HAVE_ONEDNN)
#include <dnnl.hpp>
#if DNNL_VERSION_MAJOR == 2
#define STRATA_MATMUL_ONEDNN 1
#include <mutex>
#include <unordered_map>
#else
#pragma message( \
    "tensor/cpu/matmul.cpp uses the oneDNN 2.x API; this oneDNN is not 2.x, so CPU matmul uses Eigen")
#endif
#endif

namespace strata::tensor::cpu {

namespace {

constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 512;

MatmulEngine initial_engine() {
  const std::string_view env = std::getenv("STRATA_MATMUL") ? std::getenv("STRATA_MATMUL") : "";
  if (env == "eigen") return MatmulEngine::Eigen;
  if (env == "onednn" && !have_onednn())
    user_error(
        "STRATA_MATMUL=onednn, but this build of Strata has no oneDNN (install "
        "libdnnl-dev and reconfigure, or unset STRATA_MATMUL)");
  if (!env.empty() && env != "onednn")
    user_error("STRATA_MATMUL={} is not an engine; use STRATA_MATMUL=onednn or STRATA_MATMUL=eigen",
               env);
  return have_onednn() ? MatmulEngine::OneDnn : MatmulEngine::Eigen;
}

std::atomic<MatmulEngine>& engine_state() {
  static std::atomic<MatmulEngine> e{initial_engine()};
  return e;
}

// One GEMM problem, everything in elements. a is [batch, M, K] (or [batch, K, M] when trans_a),
// b is [batch or 1, K, N] (or [.., N, K] when trans_b), c is [batch, M, N]; all contiguous.
struct Problem {
  int64_t batch, m, n, k;
  bool trans_a, trans_b, b_shared;
  float alpha, beta;
};

// ---- Eigen ----

template <int LhsOrder, int RhsOrder>
void eigen_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, float alpha) {
  using Index = Eigen::Index;
  using Gemm = Eigen::internal::general_matrix_matrix_product<Index, float, LhsOrder, false, float,
                                                              RhsOrder, false, Eigen::RowMajor, 1>;
  Eigen::internal::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic,
                                       Eigen::Dynamic, Eigen::Dynamic>
      blocking(m, n, k, /*num_threads=*/1, /*l3_blocking=*/true);
  Gemm::run(m, n, k, a, lda, b, ldb, c, 1, ldc, alpha, blocking, nullptr);
}

// c (m x n, row stride ldc) = alpha * op(a) op(b) + beta * c for one tile.
void eigen_tile(const Problem& p, int64_t m, int64_t n, const float* a, const float* b, float* c) {
  const int64_t ldc = p.n;
  if (p.beta == 0.f) {
    for (int64_t i = 0; i < m; ++i)
      std::memset(c + i * ldc, 0, static_cast<size_t>(n) * sizeof(float));
  } else if (p.beta != 1.f) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] *= p.beta;
  }
  if (p.k == 0 || p.alpha == 0.f) return;
  const int64_t lda = p.trans_a ? p.m : p.k, ldb = p.trans_b ? p.k : p.n;
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!p.trans_a && !p.trans_b) eigen_gemm<R, R>(m, n, p.k, a, lda, b, ldb, c, ldc, p.alpha);
  if (!p.trans_a && p.trans_b) eigen_gemm<R, C>(m, n, p.k, a, lda, b, ldb, c, ldc, p.alpha);
  if (p.trans_a && !p.trans_b) eigen_gemm<C, R>(m, n, p.k, a, lda, b, ldb, c, ldc, p.alpha);
  if (p.trans_a && p.trans_b) eigen_gemm<C, C>(m, n, p.k, a, lda, b, ldb, c, ldc, p.alpha);
}

void eigen_matmul(const Problem& p, const float* a, const float* b, float* c) {
  const int64_t tiles_m = (p.m + kTileM - 1) / kTileM, tiles_n = (p.n + kTileN - 1) / kTileN;
  const int64_t tiles = p.batch * tiles_m * tiles_n;
  const int64_t tile_work =
      std::min(p.m, kTileM) * std::min(p.n, kTileN) * std::max<int64_t>(p.k, 1);
  parallel_range(
      tiles,
      [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t tn = t % tiles_n, tm = (t / tiles_n) % tiles_m,
                        bi = t / (tiles_n * tiles_m);
          const int64_t i0 = tm * kTileM, j0 = tn * kTileN;
          const float* ab = a + bi * p.m * p.k;
          const float* bb = b + (p.b_shared ? 0 : bi * p.k * p.n);
          // A tile's rows start i0 rows down: i0 * K elements in [M, K], i0 elements in [K, M].
          const float* at = ab + (p.trans_a ? i0 : i0 * p.k);
          const float* bt = bb + (p.trans_b ? j0 * p.k : j0);
          eigen_tile(p, std::min(kTileM, p.m - i0), std::min(kTileN, p.n - j0), at, bt,
                     c + bi * p.m * p.n + i0 * p.n + j0);
        }
      },
      std::max<int64_t>(1, (1 << 20) / tile_work));
}

// ---- oneDNN ----

#if defined(STRATA_MATMUL_ONEDNN)

struct Key {
  Problem p;
  dnnl::memory::data_type in, out;
  int threads;
  bool operator==(const Key& o) const {
    return p.batch == o.p.batch && p.m == o.p.m && p.n == o.p.n && p.k == o.p.k &&
           p.trans_a == o.p.trans_a && p.trans_b == o.p.trans_b && p.b_shared == o.p.b_shared &&
           std::memcmp(&p.alpha, &o.p.alpha, sizeof(float)) == 0 &&
           std::memcmp(&p.beta, &o.p.beta, sizeof(float)) == 0 && in == o.in && out == o.out &&
           threads == o.threads;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    uint32_t alpha_bits, beta_bits;
    std::memcpy(&alpha_bits, &k.p.alpha, 4);
    std::memcpy(&beta_bits, &k.p.beta, 4);
    mix(k.p.batch);
    mix(k.p.m);
    mix(k.p.n);
    mix(k.p.k);
    mix(k.p.trans_a | (k.p.trans_b << 1) | (k.p.b_shared << 2));
    mix(alpha_bits);
    mix(beta_bits);
    mix(static_cast<uint64_t>(k.in) | (static_cast<uint64_t>(k.out) << 8));
    mix(static_cast<uint64_t>(k.threads));
    return static_cast<size_t>(h);
  }
};

// A cached primitive, or none when oneDNN has no (fast) kernel for the problem.
struct Cached {
  bool ok = false;
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md;
};

// Primitives by problem. Training repeats a handful of shapes, so the map stays small; it is
// cleared if it ever grows past kMaxCached (e.g. a sweep over many alphas).
class PrimitiveCache {
 public:
  static PrimitiveCache& instance() {
    static PrimitiveCache c;
    return c;
  }
  const dnnl::engine& engine() const { return engine_; }

  Cached get(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    if (map_.size() >= kMaxCached) map_.clear();
    Cached c = create(key);
    map_.emplace(key, c);
    return c;
  }

 private:
  static constexpr size_t kMaxCached = 512;
  PrimitiveCache() : engine_(make_engine()) {}

  static dnnl::engine make_engine() {
    // Note [No AMX for bf16 matmul]: before any kernel is generated, unless the user capped the
    // ISA already (the call would override their cap, which may be lower).
    if (std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr &&
        std::getenv("DNNL_MAX_CPU_ISA") == nullptr) {
      try {
        dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
      } catch (const dnnl::error&) {
        // Too late or not built in: create() still refuses the AMX kernels.
      }
    }
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }

  Cached create(const Key& key) const {
    using dnnl::memory;
    const Problem& p = key.p;
    const memory::dims a_dims{p.batch, p.m, p.k}, b_dims{p.b_shared ? 1 : p.batch, p.k, p.n};
    const memory::dims a_strides =
        p.trans_a ? memory::dims{p.m * p.k, 1, p.m} : memory::dims{p.m * p.k, p.k, 1};
    const memory::dims b_strides =
        p.trans_b ? memory::dims{p.k * p.n, 1, p.k} : memory::dims{p.k * p.n, p.n, 1};
    const memory::desc a_md(a_dims, key.in, a_strides), b_md(b_dims, key.in, b_strides);
    const memory::desc c_md({p.batch, p.m, p.n}, key.out, memory::dims{p.m * p.n, p.n, 1});
    dnnl::primitive_attr attr;
    if (p.alpha != 1.f) attr.set_output_scales(0, {p.alpha});
    if (p.beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(p.beta);
      attr.set_post_ops(ops);
    }
    Cached c;
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine_);
      // Reference kernels are correct but far slower than widening to f32; the AMX ones are
      // wrong (Note [No AMX for bf16 matmul]).
      const std::string_view impl = pd.impl_info_str();
      if (key.in != memory::data_type::f32 &&
          (impl.starts_with("ref") || impl.find("amx") != std::string_view::npos))
        return c;
      c.prim = dnnl::matmul(pd);
      c.a_md = a_md;
      c.b_md = b_md;
      c.c_md = c_md;
      c.ok = true;
    } catch (const dnnl::error&) {
      c.ok = false;  // unsupported here: the caller falls back
    }
    return c;
  }

  dnnl::engine engine_;
  std::mutex mu_;
  std::unordered_map<Key, Cached, KeyHash> map_;
};

dnnl::memory::data_type dnnl_type(DType t) {
  return t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Runs the problem through oneDNN; false when oneDNN has no kernel for these dtypes here.
bool onednn_matmul(const Problem& p, DType in, DType out, const void* a, const void* b, void* c) {
  PrimitiveCache& cache = PrimitiveCache::instance();
  const Key key{p, dnnl_type(in), dnnl_type(out), omp_get_max_threads()};
  const Cached prim = cache.get(key);
  if (!prim.ok) return false;
  const dnnl::engine& eng = cache.engine();
  dnnl::memory am(prim.a_md, eng, const_cast<void*>(a));
  dnnl::memory bm(prim.b_md, eng, const_cast<void*>(b));
  dnnl::memory cm(prim.c_md, eng, c);
  thread_local dnnl::stream stream(eng);
  prim.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
  return true;
}

#endif  // STRATA_MATMUL_ONEDNN

// f32 problem on the chosen engine.
void matmul_f32(const Problem& p, const float* a, const float* b, float* c) {
#if defined(STRATA_MATMUL_ONEDNN)
  if (matmul_engine() == MatmulEngine::OneDnn && !omp_in_parallel() &&
      onednn_matmul(p, DType::F32, DType::F32, a, b, c))
    return;
#endif
  eigen_matmul(p, a, b, c);
}

}  // namespace

bool have_onednn() {
#if defined(STRATA_MATMUL_ONEDNN)
  return true;
#else
  return false;
#endif
}

MatmulEngine matmul_engine() {
  return engine_state().load(std::memory_order_relaxed);
}

void set_matmul_engine(MatmulEngine engine) {
  if (engine == MatmulEngine::OneDnn && !have_onednn())
    user_error(
        "matmul engine onednn asked for, but this build of Strata has no oneDNN "
        "(install libdnnl-dev and reconfigure)");
  engine_state().store(engine, std::memory_order_relaxed);
}

void CpuBackend::matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                        float alpha, float beta) {
  STRATA_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
               "matmul needs contiguous tensors: {} {} {}", a.str(), b.str(), out.str());
  STRATA_CHECK(a.ndim() >= 2 && b.ndim() >= 2 && out.ndim() == a.ndim(), "matmul {} @ {} -> {}",
               a.str(), b.str(), out.str());
  const bool f32 = a.dtype() == DType::F32 && b.dtype() == DType::F32 && out.dtype() == DType::F32;
  // Note [Low-precision ops]: bf16/f16 inputs of one dtype, out F32 or that dtype.
  const bool lowp = (a.dtype() == DType::BF16 || a.dtype() == DType::F16) &&
                    b.dtype() == a.dtype() &&
                    (out.dtype() == DType::F32 || out.dtype() == a.dtype());
  STRATA_CHECK(f32 || lowp,
               "matmul dtypes {} @ {} -> {}: f32, or bf16/f16 inputs of one dtype with an f32 "
               "output or one of theirs",
               a.str(), b.str(), out.str());
  Problem p;
  p.m = out.size(-2);
  p.n = out.size(-1);
  p.k = trans_a ? a.size(-2) : a.size(-1);
  p.batch = 1;
  for (int d = 0; d + 2 < out.ndim(); ++d) p.batch *= out.size(d);
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.b_shared = b.ndim() == 2;
  p.alpha = alpha;
  p.beta = beta;
  STRATA_CHECK((trans_a ? a.size(-1) : a.size(-2)) == p.m &&
                   (trans_b ? b.size(-2) : b.size(-1)) == p.n &&
                   (trans_b ? b.size(-1) : b.size(-2)) == p.k &&
                   (p.b_shared || b.numel() == p.batch * p.k * p.n),
               "matmul shapes {} @ {} -> {}", a.str(), b.str(), out.str());
  if (out.numel() == 0) return;
  if (p.k == 0 || p.batch * p.m * p.k == 0) {  // nothing to multiply: out = beta * out
    if (beta == 0.f) {
      fill(out, 0.0);
    } else if (beta != 1.f) {
      Tensor scaled = Tensor::empty(out.shape(), DType::F32);
      affine(out, beta, 0.f, scaled);
      copy(scaled, out);
    }
    return;
  }
  if (f32) {
    matmul_f32(p, a.data<float>(), b.data<float>(), out.data<float>());
    return;
  }
#if defined(STRATA_MATMUL_ONEDNN)
  if (a.dtype() == DType::BF16 && matmul_engine() == MatmulEngine::OneDnn && !omp_in_parallel() &&
      onednn_matmul(p, DType::BF16, out.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr()))
    return;
#endif
  // No native kernel (always so for F16): widen (exact), multiply in f32, round the result once
  // if the output is low-precision (Note [Widening adapter]).
  const Tensor af = widened(a), bf = widened(b);
  F32Out o(out, /*load=*/beta != 0.f);
  matmul_f32(p, af.data<float>(), bf.data<float>(), o.get().data<float>());
  o.commit();
}

}  // namespace strata::tensor::cpu
