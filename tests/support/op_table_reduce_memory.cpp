// Op table entries: reductions, top-k, memory (copy, fill, arange, random, concat/split) and the
// gradient-clipping scale.
#include <string>

#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed, S = Layout::Strided;

OpInfo reductions() {
  OpInfo e;
  e.name = "reductions";
  e.backend = {"reduce", "sum_to", "sum_squares", "sum_squares_many"};
  e.api = {
      "sum",     "mean",          "max", "sum_to", "sum_all", "sum_squares", "sum_squares_many",
      "l2_norm", "global_l2_norm"};
  e.functions = {"sum", "mean", "max", "sum_all", "mean_all"};
  e.gradcheck = {{"sum_dim", {{{3, 4, 5}, T}}, [](V x) { return autograd::sum(x[0], 1); }},
                 {"sum_keepdim", {{{3, 4, 5}}}, [](V x) { return autograd::sum(x[0], -1, true); }},
                 {"mean_dim", {{{3, 4, 5}, S}}, [](V x) { return autograd::mean(x[0], 0); }},
                 {"max_dim", {{{4, 6}, T}}, [](V x) { return autograd::max(x[0], 1); }},
                 {"sum_all", {{{3, 5}, S}}, [](V x) { return autograd::sum_all(x[0]); }},
                 {"mean_all", {{{3, 5}}}, [](V x) { return autograd::mean_all(x[0]); }}};
  e.lowp.push_back({"sum_to",
                    [](DType dt) {
                      return Ts{lp({5, 6, 33}, 16, dt)};
                    },
                    [](const Ts& x) {
                      return Ts{tensor::sum_to(x[0], {6, 33}), tensor::sum_to(x[0], {5, 1, 33}),
                                tensor::sum_to(x[0].transpose(0, 2), {33, 1, 1})};
                    },
                    {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute}});
  e.lowp.push_back(
      {"sum_mean_sum_all",
       [](DType dt) {
         return Ts{lp({6, 40, 7}, 17, dt)};
       },
       [](const Ts& x) {
         return Ts{tensor::sum(x[0], 1), tensor::mean(x[0], 2, true), tensor::sum_all(x[0])};
       },
       {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute}});
  e.lowp.push_back({"max",
                    [](DType dt) {
                      return Ts{lp({6, 40, 7}, 18, dt)};
                    },
                    [](const Ts& x) {
                      tensor::MaxResult r = tensor::max(x[0], 1);
                      return Ts{r.values, r.indices};
                    },
                    {LowpOut::Compute, LowpOut::I64},
                    /*exact=*/true});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1);
    const Tensor cols = rnd({3, 100, 40}, 25), cols2 = rnd({1000, 24}, 26);
    std::vector<DeviceSample> c;
    c.push_back({"reductions", [=](Device d) {
                   return Ts{tensor::sum(on(a, dt, d), 0), tensor::mean(on(a, dt, d), 2),
                             tensor::sum_to(on(a, dt, d), {1, 17}), tensor::sum_all(on(a, dt, d)),
                             tensor::from_vector(
                                 {static_cast<float>(tensor::sum_squares(on(a, dt, d)))}, {1})
                                 .to(d)};
                 }});
    // Bias gradients: [N, C] -> [C] with N >= 128 takes the column-sum kernels (Note [CUDA
    // column sums]), several chunks of rows and a partial last one; the F32 output of a
    // low-precision input is the mixed-precision case.
    c.push_back({"column_sums", [=](Device d) {
                   return Ts{tensor::sum_to(on(cols, dt, d), {40}),
                             tensor::sum_to(on(cols, dt, d).reshape({300, 40}), {40}),
                             tensor::sum_to(on(cols2, dt, d), {24})};
                 }});
    c.push_back({"max",
                 [=](Device d) {
                   tensor::MaxResult mx = tensor::max(on(a, dt, d), 1);
                   return Ts{mx.values, mx.indices.to(DType::F32)};
                 },
                 0.0, 0.0, /*exact_lowp=*/true});
    return c;
  };
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    std::vector<DeviceSample> c;
    c.push_back({"reductions", [=](Device d) {
                   return Ts{tensor::sum(z({0, 3}, d), 0),
                             tensor::sum(z({3, 0}, d), 1),
                             tensor::mean(z({0, 3}, d), 1),
                             tensor::sum_to(z({0, 6}, d), {6}),
                             tensor::sum_to(z({5, 0}, d), {0}),
                             tensor::from_vector(
                                 {static_cast<float>(tensor::sum_squares(z({0, 7}, d)))}, {1})};
                 }});
    c.push_back({"sum_squares_many", [=](Device d) {
                   const std::vector<double> s = tensor::sum_squares_many(
                       {z({0}, d), tensor::uniform({9}, {7, 3}, -1.f, 1.f).to(dt).to(d)});
                   return Ts{tensor::from_vector(
                       {static_cast<float>(s[0]), static_cast<float>(s[1])}, {2})};
                 }});
    c.push_back({"max_empty_dim", [=](Device d) {
                   tensor::MaxResult m = tensor::max(z({3, 0}, d), 1);
                   return Ts{m.values, m.indices.to(DType::F32)};
                 }});
    c.push_back({"max_no_rows", [=](Device d) {
                   tensor::MaxResult m = tensor::max(z({0, 4}, d), 1);
                   return Ts{m.values, m.indices.to(DType::F32)};
                 }});
    return c;
  };
  // Reductions over any dim, sum_to, max.
  e.random = {1, [](Draw& r) -> RandomSample {
                const Shape s{r.size(1, 40), r.size(1, 300), r.size(1, 40)};
                const Tensor a = r.values(s);
                const int dim = static_cast<int>(r.size(0, 2));
                return {"reductions " + s.str() + " dim " + std::to_string(dim),
                        [=](DType dt, Device d) {
                          const Tensor x = on(a, dt, d);
                          tensor::MaxResult m = tensor::max(x, dim);
                          return Ts{tensor::sum(x, dim),
                                    tensor::mean(x, dim, true),
                                    tensor::sum_to(x, {s[2]}),
                                    tensor::sum_to(x, {s[0], 1, s[2]}),
                                    m.values,
                                    m.indices.to(DType::F32)};
                        },
                        1e-4, 1e-4};
              }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"sum_squares_many",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) {
                tensor::sum_squares_many({t[0], t[1]});
              }}};
  return e;
}

// Top-k selection; its special values (NaN, infinities, signed zeros, ties) are checked by
// CudaOps.TopKSelectsTheCpusElementsInTheCpusOrder and tests/tensor/reduce_test.cpp.
OpInfo top_k() {
  OpInfo e;
  e.name = "top_k";
  e.backend = {"top_k"};
  e.api = {"top_k"};
  e.lowp.push_back({"top_k",
                    [](DType dt) {
                      return Ts{lp({3, 300}, 51, dt)};
                    },
                    [](const Ts& x) {
                      tensor::TopKResult r = tensor::top_k(x[0], 7);
                      return Ts{r.values, r.indices};
                    },
                    {LowpOut::Compute, LowpOut::I64},
                    /*exact=*/true});  // values are copied, not rounded
  e.cuda = [](DType dt) {
    const Tensor x = rnd({3, 1100}, 61);
    std::vector<DeviceSample> c;
    c.push_back({"top_k",
                 [=](Device d) {
                   tensor::TopKResult r = tensor::top_k(on(x, dt, d), 9);
                   return Ts{r.values, r.indices.to(DType::F32)};
                 },
                 0.0, 0.0, /*exact_lowp=*/true});
    return c;
  };
  return e;
}

// x *= g / expected unless g == expected (gradient clipping and loss scaling).
OpInfo scale_unless_equal() {
  OpInfo e;
  e.name = "scale_unless_equal";
  e.backend = {"scale_unless_equal"};
  e.api = {"scale_unless_equal_"};
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1);
    std::vector<DeviceSample> c;
    c.push_back({"scale_unless_equal", [=](Device d) {
                   const Tensor g = tensor::full({1}, 1.5, DType::F32, d);
                   Tensor same = on(a, dt, d).clone(), other = on(a, dt, d).clone();
                   tensor::scale_unless_equal_(same, g, 1.5f);
                   tensor::scale_unless_equal_(other, g, 0.375f);
                   return Ts{same, other};
                 }});
    return c;
  };
  using MV = std::vector<Tensor>;
  e.mixed = {{"scale_unless_equal_",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({1}, 2, d)};
              },
              [](MV& t) { tensor::scale_unless_equal_(t[0], t[1], 1.f); }}};
  return e;
}

OpInfo memory() {
  OpInfo e;
  e.name = "memory";
  e.backend = {"copy", "fill", "arange", "random_uniform", "random_normal", "concat"};
  e.api = {"concat", "split"};
  e.functions = {"concat", "split", "contiguous", "to"};
  e.gradcheck_exempt = {{"to",
                         "a cast to bf16/f16 rounds away the finite differences; "
                         "LowpAutograd.CastSendsTheGradientBackInTheInputDtype checks it"}};
  e.gradcheck = {{"contiguous",
                  {{{4, 5}, T}},
                  [](V x) { return autograd::square(autograd::contiguous(x[0])); }},
                 {"concat",
                  {{{2, 3}}, {{2, 5}, T}},
                  [](V x) {
                    return autograd::square(autograd::concat({x[0], x[1]}, 1));
                  }},
                 {"split", {{{3, 7}, S}}, [](V x) {
                    auto parts = autograd::split(x[0], {2, 5}, 1);
                    return autograd::mul(autograd::sum(parts[0], 1), autograd::sum(parts[1], 1));
                  }}};
  e.lowp.push_back(
      {"copy_fill_arange_concat",
       [](DType dt) {
         return Ts{lp({4, 5}, 14, dt), lp({4, 3}, 15, dt)};
       },
       [](const Ts& x) {
         const DType dt = x[0].dtype();
         Tensor filled = Tensor::empty({3, 4}, dt);
         filled.fill_(0.1);
         Tensor strided = Tensor::empty({5, 4}, dt);
         strided.copy_(x[0].transpose(0, 1));
         return Ts{strided, filled, tensor::arange(40, dt), tensor::concat({x[0], x[1]}, 1)};
       },
       {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute, LowpOut::Compute},
       /*exact=*/true});
  e.lowp.push_back({"random",
                    [](DType dt) {
                      return Ts{Tensor::empty({3, 50}, dt)};
                    },
                    [](const Ts& x) {
                      Tensor u = Tensor::empty(x[0].shape(), x[0].dtype());
                      Tensor n = Tensor::empty(x[0].shape(), x[0].dtype());
                      tensor::Backend& be = tensor::backend_for(x[0].device());
                      be.random_uniform(u, RngKey{3, 4}, -2.f, 2.f);
                      be.random_normal(n, RngKey{3, 5}, 0.5f, 2.f);
                      return Ts{u, n};
                    },
                    {LowpOut::Compute, LowpOut::Compute},
                    /*exact=*/true});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), b = rnd({33, 17}, 2), q = rnd({2, 3, 29, 40}, 11);
    const Tensor ids = tensor::from_ints({3, 7, 3, 49, 0, 3, 12}, {7}, DType::I32);
    // A copy whose destination is a strided view: src [33, 17] into the transpose of a [17, 33].
    auto strided_into = [](const Tensor& src) {
      Tensor dst = tensor::zeros({src.size(1), src.size(0)}, src.dtype(), src.device());
      Tensor view = dst.transpose(0, 1);
      view.copy_(src);
      return dst;
    };
    std::vector<DeviceSample> c;
    c.push_back(
        {"copy_cast_fill",
         [=](Device d) {
           Tensor h = on(a, dt, d).transpose(0, 1).to(DType::F16).to(DType::F32);
           Tensor bf = on(a, dt, d).to(DType::BF16).to(DType::F32);
           Tensor i = on(a, dt, d).to(DType::I32).to(DType::F32);
           return Ts{
               h, bf, i, on(a, DType::F32, d).to(dt),  // contiguous cast path
               on(a, dt, d).transpose(1, 2).contiguous(),
               // Note [CUDA same-dtype copies]: layouts that merge to 3 dims, a
               // narrow, a copy into a strided view.
               on(q, dt, d).transpose(1, 2).contiguous(), on(a, dt, d).narrow(2, 3, 9).contiguous(),
               strided_into(on(b, dt, d)),
               ids.to(d).to(DType::I64).reshape({7, 1}).expand({7, 3}).contiguous().to(DType::F32),
               tensor::full({3, 5}, 2.5, dt, d), tensor::arange(11, dt, d),
               tensor::concat({on(a, dt, d), on(a, dt, d)}, 1)};
         },
         0.0, 0.0, /*exact_lowp=*/true});
    c.push_back({"random", [=](Device d) {
                   // Drawn in f32 exactly as for F32, then rounded once into dt.
                   Tensor n = Tensor::empty({1001}, dt, d), u = Tensor::empty({1001}, dt, d);
                   tensor::backend_for(d).random_normal(n, {7, 8}, 0.f, 1.f);
                   tensor::backend_for(d).random_uniform(u, {7, 9}, -1.f, 1.f);
                   return Ts{n, u};
                 }});
    return c;
  };
  e.empty = [](DType dt) {
    std::vector<DeviceSample> c;
    c.push_back(
        {"concat_split", [=](Device d) {
           const Tensor a = tensor::uniform({2, 3}, {7, 16}, -1.f, 1.f).to(dt).to(d);
           const Tensor z0 = tensor::zeros({0, 3}, dt, d), z1 = tensor::zeros({2, 0}, dt, d);
           Ts out{tensor::concat({a, z0, a}, 0), tensor::concat({z1, a}, 1)};
           for (const Tensor& p : tensor::split(a, {0, 2, 0, 1, 0}, 1)) out.push_back(p);
           return out;
         }});
    return c;
  };
  using MV = std::vector<Tensor>;
  e.mixed = {{"concat",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) {
                tensor::concat({t[0], t[1]}, 0);
              }}};
  return e;
}

// Views: the tensor side is Tensor's own (reshape, transpose, ...), no op API or Backend method.
OpInfo shape() {
  OpInfo e;
  e.name = "shape";
  e.functions = {"reshape", "transpose", "permute", "narrow", "slice"};
  e.gradcheck = {
      {"reshape",
       {{{3, 4}, T}},
       [](V x) {
         return autograd::mul(autograd::reshape(x[0], {2, 6}), autograd::reshape(x[0], {2, 6}));
       }},
      {"transpose",
       {{{2, 3, 4}}},
       [](V x) { return autograd::square(autograd::transpose(x[0], 0, 2)); }},
      {"permute",
       {{{2, 3, 4}, S}},
       [](V x) {
         return autograd::square(autograd::permute(x[0], {1, 2, 0}));
       }},
      {"narrow", {{{5, 6}}}, [](V x) { return autograd::square(autograd::narrow(x[0], 1, 2, 3)); }},
      {"slice_step", {{{7, 3}, T}}, [](V x) {
         return autograd::square(autograd::slice(x[0], 0, 1, 7, 2));
       }}};
  return e;
}

}  // namespace

void add_reduction_and_memory_ops(std::vector<OpInfo>& table) {
  table.push_back(reductions());
  table.push_back(top_k());
  table.push_back(scale_unless_equal());
  table.push_back(memory());
}

void add_shape_ops(std::vector<OpInfo>& table) {
  table.push_back(shape());
}

}  // namespace strata::testing
