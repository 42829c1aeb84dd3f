// GFLOP/s of Strata's CPU matmul (tensor::matmul_out) against oneDNN called directly (one matmul
// primitive built once, executed repeatedly) on GPT-2-like shapes, in the same run.
//
//   bench_matmul [--reps N] [--quick] [--vocab N] [--eigen]
//
// For each linear layer shape it times the forward (x @ W, "NN"), the input gradient
// (dy @ W^T, "NT") and the weight gradient accumulated into an existing gradient
// (dW += x^T @ dy, "TN", beta = 1), plus the two batched attention products. Each timing is the
// median of --reps runs after two warm-up runs; Strata and oneDNN runs alternate so drift in the
// machine's load hits both alike. --eigen adds a column for Strata's Eigen engine.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cpu_features.h"
#include "tensor/cpu/matmul.h"
#include "tensor/ops.h"
#include "tools/bench/bench_cli.h"

#if defined(STRATA_HAVE_ONEDNN)
#include <dnnl.hpp>
#if DNNL_VERSION_MAJOR == 2
#define BENCH_ONEDNN 1
#endif
#endif

using namespace strata;
using namespace strata::tensor;

namespace {

struct Case {
  std::string name;
  int64_t batch, m, n, k;
  bool ta, tb;
  float beta;
};

double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#if defined(BENCH_ONEDNN)
// The same problem as one oneDNN primitive, built once.
class DirectOneDnn {
 public:
  DirectOneDnn(const Case& c, void* a, void* b, void* out)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using dnnl::memory;
    const auto f32 = memory::data_type::f32;
    const memory::dims a_strides =
        c.ta ? memory::dims{c.m * c.k, 1, c.m} : memory::dims{c.m * c.k, c.k, 1};
    const memory::dims b_strides =
        c.tb ? memory::dims{c.k * c.n, 1, c.k} : memory::dims{c.k * c.n, c.n, 1};
    memory::desc a_md({c.batch, c.m, c.k}, f32, a_strides);
    memory::desc b_md({c.batch, c.k, c.n}, f32, b_strides);
    memory::desc c_md({c.batch, c.m, c.n}, f32, memory::dims{c.m * c.n, c.n, 1});
    dnnl::primitive_attr attr;
    if (c.beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(c.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng_);
    impl_ = pd.impl_info_str();
    prim_ = dnnl::matmul(pd);
    args_ = {{DNNL_ARG_SRC, memory(a_md, eng_, a)},
             {DNNL_ARG_WEIGHTS, memory(b_md, eng_, b)},
             {DNNL_ARG_DST, memory(c_md, eng_, out)}};
  }
  void run() {
    prim_.execute(stream_, args_);
    stream_.wait();
  }
  const std::string& impl() const { return impl_; }

 private:
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::matmul prim_;
  std::unordered_map<int, dnnl::memory> args_;
  std::string impl_;
};
#endif

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  bool quick = false, eigen = false;
  int64_t vocab = 50304 / 4;
  // Note [Bench command line].
  CLI::App app{"Strata's matmul against oneDNN called directly, GPT-2 small's linear layers",
               "bench_matmul"};
  strata::bench::count_option(app, "--reps", reps, "timed runs per case (median)");
  app.add_flag("--quick", quick, "fewer token counts and linear layers");
  strata::bench::count_option(app, "--vocab", vocab, "the head's vocabulary (50304: GPT-2's)");
  app.add_flag("--eigen", eigen, "a column for Strata's Eigen engine");
  if (const std::optional<int> status = strata::bench::parse_args(app, argc, argv)) return *status;

  // GPT-2 small (C = 768) linear layers at B*T tokens; vocab defaults to 50304 / 4 to keep the
  // run short (--vocab 50304 for the real head).
  std::vector<Case> cases;
  const std::vector<int64_t> token_counts =
      quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048};
  struct Linear {
    const char* name;
    int64_t in, out;
  };
  std::vector<Linear> linears = {{"c_attn", 768, 2304},
                                 {"attn.c_proj", 768, 768},
                                 {"mlp.c_fc", 768, 3072},
                                 {"mlp.c_proj", 3072, 768},
                                 {"lm_head", 768, vocab}};
  if (quick) linears = {{"c_attn", 768, 2304}, {"mlp.c_proj", 3072, 768}};
  for (int64_t tokens : token_counts) {
    for (const Linear& l : linears) {
      if (tokens == 2048 && std::string(l.name) == "lm_head")
        continue;  // the longest; once is enough
      const std::string base = std::string(l.name) + " T=" + std::to_string(tokens);
      cases.push_back({base + " fwd x@W", 1, tokens, l.out, l.in, false, false, 0.f});
      cases.push_back({base + " dx=dy@W^T", 1, tokens, l.in, l.out, false, true, 0.f});
      cases.push_back({base + " dW+=x^T@dy", 1, l.in, l.out, tokens, true, false, 1.f});
    }
  }
  // Attention at T = 1024, 12 heads of 64 (unfused form): scores = q k^T, out = p v.
  cases.push_back({"attn q@k^T B*H=12", 12, 1024, 1024, 64, false, true, 0.f});
  cases.push_back({"attn p@v B*H=12", 12, 1024, 64, 1024, false, false, 0.f});

  std::printf("# bench_matmul: f32, %d threads, CPU: %s, median of %d (2 warm-up)\n",
              omp_get_max_threads(), cpu_features().summary().c_str(), reps);
#if defined(BENCH_ONEDNN)
  const dnnl_version_t* v = dnnl_version();
  std::printf("# oneDNN %d.%d.%d; Strata engine: %s\n\n", v->major, v->minor, v->patch,
              cpu::matmul_engine() == cpu::MatmulEngine::OneDnn ? "onednn" : "eigen");
  std::printf(
      "| case | batch | M | N | K | Strata GFLOP/s | oneDNN GFLOP/s | ratio |%s same bits |\n",
      eigen ? " Strata-Eigen GFLOP/s |" : "");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|%s---|\n", eigen ? "---:|" : "");
#else
  std::printf("# built without oneDNN: Strata numbers only\n\n");
  std::printf("| case | batch | M | N | K | Strata GFLOP/s |\n|---|---:|---:|---:|---:|---:|\n");
#endif

  uint64_t seed = 1;
  for (const Case& c : cases) {
    const double flops = 2.0 * c.batch * c.m * c.n * c.k;
    Shape as = c.ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k};
    Shape bs = c.tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n};
    if (c.batch == 1) {  // plain 2-d operands, as the linear layers pass them
      as = Shape{as[1], as[2]};
      bs = Shape{bs[1], bs[2]};
    }
    Tensor a = uniform(as, {seed++, 1}, -1.f, 1.f), b = uniform(bs, {seed++, 1}, -1.f, 1.f);
    Shape os = c.batch == 1 ? Shape{c.m, c.n} : Shape{c.batch, c.m, c.n};
    Tensor out = zeros(os), ref_out = zeros(os);
    auto strata_run = [&] { matmul_out(a, b, out, c.ta, c.tb, 1.f, c.beta); };
    std::vector<double> ts, tr, te;
#if defined(BENCH_ONEDNN)
    DirectOneDnn direct(c, a.data_ptr(), b.data_ptr(), ref_out.data_ptr());
    // Same-bits check: one call each from the same starting output.
    strata_run();
    direct.run();
    const bool same = std::memcmp(out.data_ptr(), ref_out.data_ptr(), out.nbytes()) == 0;
    for (int w = 0; w < 2; ++w) {
      strata_run();
      direct.run();
    }
    for (int r = 0; r < reps; ++r) {
      ts.push_back(seconds(strata_run));
      tr.push_back(seconds([&] { direct.run(); }));
    }
    if (eigen) {
      cpu::MatmulEngineScope scope(cpu::MatmulEngine::Eigen);
      strata_run();
      for (int r = 0; r < std::max(1, reps / 2); ++r) te.push_back(seconds(strata_run));
    }
    const double gs = flops / median(ts) * 1e-9, gr = flops / median(tr) * 1e-9;
    std::string eig =
        eigen ? " " + std::to_string(static_cast<int>(flops / median(te) * 1e-9 + 0.5)) + " |" : "";
    std::printf("| %s | %ld | %ld | %ld | %ld | %.1f | %.1f | %.3f |%s %s |\n", c.name.c_str(),
                static_cast<long>(c.batch), static_cast<long>(c.m), static_cast<long>(c.n),
                static_cast<long>(c.k), gs, gr, gs / gr, eig.c_str(), same ? "yes" : "NO");
#else
    for (int w = 0; w < 2; ++w) strata_run();
    for (int r = 0; r < reps; ++r) ts.push_back(seconds(strata_run));
    std::printf("| %s | %ld | %ld | %ld | %ld | %.1f |\n", c.name.c_str(),
                static_cast<long>(c.batch), static_cast<long>(c.m), static_cast<long>(c.n),
                static_cast<long>(c.k), flops / median(ts) * 1e-9);
#endif
    std::fflush(stdout);
  }
  return 0;
}
