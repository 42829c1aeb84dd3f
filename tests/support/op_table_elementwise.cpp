// Op table entries: broadcasting binary ops, affine/axpy, unary ops, bias_add, dropout.
#include <string>

#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using tensor::BinaryOp;
using tensor::UnaryOp;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed, S = Layout::Strided;

// The unary entry's samples loop over this list: a new UnaryOp must be added to it.
constexpr UnaryOp kUnaryOps[] = {UnaryOp::Gelu, UnaryOp::Silu,   UnaryOp::Relu,
                                 UnaryOp::Exp,  UnaryOp::Log,    UnaryOp::Neg,
                                 UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Tanh};
static_assert(static_cast<int>(UnaryOp::Tanh) + 1 == std::size(kUnaryOps),
              "a new UnaryOp needs its place in kUnaryOps (and a gradcheck sample if "
              "autograd/functions.h gains a function for it)");
static_assert(static_cast<int>(BinaryOp::Div) == 3, "a new BinaryOp needs samples in 'binary'");

OpInfo binary() {
  OpInfo e;
  e.name = "binary";
  e.backend = {"binary"};
  e.api = {"add", "sub", "mul", "div"};
  e.functions = {"add", "sub", "mul", "div"};
  e.gradcheck = {
      {"add_broadcast", {{{3, 5, 7}}, {{5, 1}, S}}, [](V x) { return autograd::add(x[0], x[1]); }},
      {"sub_broadcast", {{{3, 1, 7}}, {{4, 7}, T}}, [](V x) { return autograd::sub(x[0], x[1]); }},
      {"mul_broadcast", {{{2, 3, 5}, T}, {{5}}}, [](V x) { return autograd::mul(x[0], x[1]); }},
      {"div", {{{4, 7}}, {{4, 7}, S, Values::Positive}}, [](V x) {
         return autograd::div(x[0], x[1]);
       }}};
  const std::pair<const char*, BinaryOp> binaries[] = {{"add", BinaryOp::Add},
                                                       {"sub", BinaryOp::Sub},
                                                       {"mul", BinaryOp::Mul},
                                                       {"div", BinaryOp::Div}};
  for (auto [name, op] : binaries) {
    e.lowp.push_back(
        {std::string("binary_") + name,
         [](DType dt) {
           return Ts{lp({4, 6, 10}, 1, dt), lp({6, 10}, 2, dt, 0.5f, 1.5f),
                     lp({4, 1, 10}, 3, dt, 0.5f, 1.5f)};
         },
         [op](const Ts& x) {
           auto f = [op](const Tensor& a, const Tensor& b) {
             Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), a.dtype());
             tensor::backend_for(a.device()).binary(op, a, b, out);
             return out;
           };
           // Full, row-broadcast, general broadcast, strided and scalar-like operands.
           return Ts{f(x[0], x[0]), f(x[0], x[1]), f(x[0], x[2]),
                     f(x[0].transpose(0, 2), x[2].transpose(0, 2)), f(x[1].narrow(0, 0, 1), x[0])};
         },
         {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute, LowpOut::Compute,
          LowpOut::Compute}});
  }
  e.lowp.push_back({"add_sub_mul_div_ops",
                    [](DType dt) {
                      return Ts{lp({3, 7}, 4, dt), lp({7}, 5, dt, 0.5f, 1.5f)};
                    },
                    [](const Ts& x) {
                      return Ts{tensor::add(x[0], x[1]), tensor::sub(x[0], x[1]),
                                tensor::mul(x[0], x[1]), tensor::div(x[0], x[1])};
                    },
                    {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute, LowpOut::Compute}});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), b = rnd({33, 17}, 2),
                 pos = rnd({4, 33, 17}, 3, 0.1f, 3.f);
    std::vector<DeviceSample> c;
    c.push_back({"binary_broadcast", [=](Device d) {
                   return Ts{tensor::add(on(a, dt, d), on(b, dt, d)),
                             tensor::sub(on(a, dt, d), on(b, dt, d)),
                             tensor::mul(on(a, dt, d), on(b, dt, d)),
                             tensor::div(on(a, dt, d), on(pos, dt, d))};
                 }});
    c.push_back({"binary_strided", [=](Device d) {
                   return Ts{
                       tensor::add(on(a, dt, d).transpose(1, 2), on(a, dt, d).transpose(1, 2))};
                 }});
    return c;
  };
  e.empty = [](DType dt) {
    std::vector<DeviceSample> c;
    c.push_back({"binary", [=](Device d) {
                   const Tensor a = tensor::zeros({0, 5}, dt, d),
                                b = tensor::uniform({5}, {7, 1}, -1.f, 1.f).to(dt).to(d);
                   return Ts{tensor::add(a, b), tensor::sub(a, a), tensor::mul(b, a),
                             tensor::div(a, b),
                             tensor::add(tensor::zeros({3, 0}, dt, d), tensor::zeros({0}, dt, d))};
                 }});
    return c;
  };
  // Broadcasting binary ops, unary ops and their backward, bias_add.
  e.random = {0, [](Draw& r) -> RandomSample {
                const Shape s{r.size(1, 9), r.size(1, 70), r.size(1, 70)};
                Shape sb = s;
                for (int i = 0; i < 3; ++i)
                  if (r.coin()) sb[i] = 1;
                const Tensor a = r.values(s), b = r.values(sb), pos = r.values(s, 0.1f, 3.f);
                const Tensor bias = r.values({s[2]});
                const UnaryOp op = r.pick<UnaryOp>({UnaryOp::Gelu, UnaryOp::Silu, UnaryOp::Relu,
                                                    UnaryOp::Exp, UnaryOp::Log, UnaryOp::Neg,
                                                    UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Tanh});
                return {"elementwise " + s.str() + " with " + sb.str(), [=](DType dt, Device d) {
                          const Tensor x = on(a, dt, d), y = on(b, dt, d), p = on(pos, dt, d);
                          return Ts{tensor::add(x, y),
                                    tensor::mul(y, x),
                                    tensor::div(x, p),
                                    tensor::unary(op, p),
                                    tensor::unary_backward(op, p, x),
                                    tensor::bias_add(x, on(bias, dt, d)),
                                    tensor::add(x.transpose(1, 2), x.transpose(1, 2))};
                        }};
              }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"add",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::add(t[0], t[1]); }},
             {"sub",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::sub(t[0], t[1]); }},
             {"mul",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::mul(t[0], t[1]); }},
             {"div",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::div(t[0], t[1]); }}};
  return e;
}

OpInfo affine_axpy() {
  OpInfo e;
  e.name = "affine_axpy";
  e.backend = {"affine", "axpy"};
  e.api = {"scale", "affine", "axpy_"};
  e.functions = {"scale", "affine"};
  e.gradcheck = {{"scale", {{{3, 5}, T}}, [](V x) { return autograd::scale(x[0], -1.7f); }},
                 {"affine", {{{9}}}, [](V x) { return autograd::affine(x[0], 0.3f, 2.f); }}};
  e.lowp.push_back(
      {"affine_scale",
       [](DType dt) {
         return Ts{lp({5, 9}, 6, dt)};
       },
       [](const Ts& x) {
         return Ts{tensor::affine(x[0].transpose(0, 1), 1.5f, -0.25f), tensor::scale(x[0], 0.3f)};
       },
       {LowpOut::Compute, LowpOut::Compute}});
  e.lowp.push_back({"axpy",
                    [](DType dt) {
                      return Ts{lp({300}, 7, dt), lp({300}, 8, dt)};
                    },
                    [](const Ts& x) {
                      Tensor y = x[1].clone();
                      tensor::axpy_(0.7f, x[0], y);
                      return Ts{y};
                    },
                    {LowpOut::Compute}});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), pos = rnd({4, 33, 17}, 3, 0.1f, 3.f);
    std::vector<DeviceSample> c;
    c.push_back({"affine_axpy", [=](Device d) {
                   Tensor y = on(a, dt, d).clone();
                   tensor::axpy_(0.5f, on(pos, dt, d), y);
                   // Mixed dtypes (gradient accumulation): low-precision x into an F32 y and back.
                   Tensor y32 = on(a, DType::F32, d).clone();
                   tensor::axpy_(0.5f, on(pos, dt, d), y32);
                   Tensor ylp = on(a, dt, d).clone();
                   tensor::axpy_(-1.5f, on(pos, DType::F32, d), ylp);
                   return Ts{tensor::affine(on(a, dt, d).transpose(0, 2), 3.f, -1.f), y, y32, ylp};
                 }});
    return c;
  };
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    std::vector<DeviceSample> c;
    c.push_back({"axpy_unary", [=](Device d) {
                   Tensor y = z({0, 4}, d);
                   tensor::axpy_(2.f, z({0, 4}, d), y);
                   return Ts{y, tensor::gelu(z({0, 3}, d)),
                             tensor::unary_backward(UnaryOp::Silu, z({2, 0}, d), z({2, 0}, d)),
                             tensor::bias_add(z({0, 4}, d),
                                              tensor::uniform({4}, {7, 2}, -1.f, 1.f).to(dt).to(d)),
                             tensor::dropout(z({0, 4}, d), 0.5f, {1, 2})};
                 }});
    return c;
  };
  using MV = std::vector<Tensor>;
  e.mixed = {{"axpy_",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::axpy_(2.f, t[0], t[1]); }}};
  return e;
}

OpInfo unary() {
  OpInfo e;
  e.name = "unary";
  e.backend = {"unary", "unary_backward"};
  e.api = {"unary", "unary_backward", "gelu", "silu"};
  e.functions = {"gelu", "silu", "relu", "exp", "log", "tanh", "square"};
  e.gradcheck = {
      {"gelu", {{{5, 7}, S}}, [](V x) { return autograd::gelu(x[0]); }},
      {"silu", {{{5, 7}, T}}, [](V x) { return autograd::silu(x[0]); }},
      {"relu", {{{6, 5}, S, Values::AwayFromZero}}, [](V x) { return autograd::relu(x[0]); }},
      {"exp", {{{3, 5}}}, [](V x) { return autograd::exp(x[0]); }},
      {"log", {{{3, 5}, T, Values::Positive}}, [](V x) { return autograd::log(x[0]); }},
      {"tanh", {{{11}}}, [](V x) { return autograd::tanh(x[0]); }},
      {"square", {{{4, 3}, S}}, [](V x) { return autograd::square(x[0]); }}};
  const std::pair<const char*, UnaryOp> names[] = {
      {"gelu", UnaryOp::Gelu}, {"silu", UnaryOp::Silu},     {"relu", UnaryOp::Relu},
      {"exp", UnaryOp::Exp},   {"log", UnaryOp::Log},       {"neg", UnaryOp::Neg},
      {"sqrt", UnaryOp::Sqrt}, {"square", UnaryOp::Square}, {"tanh", UnaryOp::Tanh}};
  static_assert(std::size(names) == std::size(kUnaryOps));
  for (auto [name, op] : names) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
    e.lowp.push_back({std::string("unary_") + name,
                      [positive](DType dt) {
                        return Ts{positive ? lp({7, 37}, 9, dt, 0.1f, 3.f)
                                           : lp({7, 37}, 9, dt, -3.f, 3.f),
                                  lp({7, 37}, 10, dt)};
                      },
                      [op](const Ts& x) {
                        return Ts{tensor::unary(op, x[0]), tensor::unary_backward(op, x[0], x[1])};
                      },
                      {LowpOut::Compute, LowpOut::Compute},
                      /*exact=*/op == UnaryOp::Relu || op == UnaryOp::Neg});
  }
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), pos = rnd({4, 33, 17}, 3, 0.1f, 3.f);
    std::vector<DeviceSample> c;
    for (UnaryOp op : kUnaryOps) {
      c.push_back({"unary_" + std::to_string(static_cast<int>(op)), [=](Device d) {
                     return Ts{tensor::unary(op, on(pos, dt, d)),
                               tensor::unary_backward(op, on(pos, dt, d), on(a, dt, d))};
                   }});
    }
    return c;
  };
  using MV = std::vector<Tensor>;
  e.mixed = {{"unary_backward",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::unary_backward(UnaryOp::Gelu, t[0], t[1]); }}};
  return e;
}

OpInfo bias_add() {
  OpInfo e;
  e.name = "bias_add";
  e.backend = {"bias_add"};
  e.api = {"bias_add"};
  e.functions = {"bias_add"};
  e.gradcheck = {
      {"bias_add", {{{2, 3, 7}, T}, {{7}}}, [](V x) { return autograd::bias_add(x[0], x[1]); }}};
  e.lowp.push_back({"bias_add",
                    [](DType dt) {
                      return Ts{lp({6, 11}, 11, dt), lp({11}, 12, dt)};
                    },
                    [](const Ts& x) { return Ts{tensor::bias_add(x[0], x[1])}; },
                    {LowpOut::Compute}});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), b = rnd({33, 17}, 2), x2 = rnd({37, 96}, 7),
                 bias = rnd({96}, 9);
    std::vector<DeviceSample> c;
    c.push_back({"bias_add", [=](Device d) {
                   // 96 columns: the packed path; 17 columns: the scalar one.
                   return Ts{tensor::bias_add(on(x2, dt, d), on(bias, dt, d)),
                             tensor::bias_add(on(a, dt, d), on(b.select(0, 0), dt, d))};
                 }});
    return c;
  };
  using MV = std::vector<Tensor>;
  e.mixed = {{"bias_add",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({4}, 2, d)};
              },
              [](MV& t) { tensor::bias_add(t[0], t[1]); }}};
  return e;
}

OpInfo dropout() {
  OpInfo e;
  e.name = "dropout";
  e.backend = {"dropout"};
  e.api = {"dropout"};
  e.functions = {"dropout"};
  e.gradcheck = {{"dropout", {{{6, 9}, S}}, [](V x) {
                    return autograd::dropout(x[0], 0.3f, {7, 11});
                  }}};
  e.lowp.push_back({"dropout",
                    [](DType dt) {
                      return Ts{lp({9, 41}, 13, dt)};
                    },
                    [](const Ts& x) {
                      return Ts{tensor::dropout(x[0], 0.3f, RngKey{5, 6}),
                                tensor::dropout(x[0], 0.f, RngKey{5, 6})};
                    },
                    {LowpOut::Compute, LowpOut::Compute},
                    /*exact=*/true});
  e.cuda = [](DType dt) {
    const Tensor a = rnd({4, 33, 17}, 1), x2 = rnd({37, 96}, 7);
    std::vector<DeviceSample> c;
    c.push_back({"dropout",
                 [=](Device d) {
                   return Ts{tensor::dropout(on(x2, dt, d), 0.3f, {5, 6}),
                             tensor::dropout(on(a, dt, d), 0.5f, {5, 7})};
                 },
                 1e-5, 1e-4, /*exact_lowp=*/true});
    return c;
  };
  return e;
}

}  // namespace

void add_elementwise_ops(std::vector<OpInfo>& table) {
  table.push_back(binary());
  table.push_back(affine_axpy());
  table.push_back(unary());
  table.push_back(bias_add());
  table.push_back(dropout());
}

}  // namespace strata::testing
