#include "parallel/tp_grad_norm.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "optim/grad_clip.h"
#include "tensor/ops.h"

namespace strata::parallel {

namespace {
struct Split {
  std::vector<tensor::Tensor> sharded, replicated;
};

Split split_grads(const models::CausalLM& model) {
  Split s;
  for (auto& [name, p] : model.named_parameters()) {
    if (!p.grad().defined()) continue;
    (model.shard_specs().contains(name) ? s.sharded : s.replicated).push_back(p.grad());
  }
  return s;
}
}  // namespace

double tp_global_grad_norm(const models::CausalLM& model) {
  const Split s = split_grads(model);
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  double sharded = optim::grad_sum_of_squares(s.sharded);
  if (tp.enabled()) {
    // Every rank's double, gathered bit for bit and added in rank order: exact inputs, the same
    // sum on every rank.
    const int n = tp.size();
    tensor::Tensor mine = tensor::Tensor::empty({1}, DType::I64);
    std::memcpy(mine.data_ptr(), &sharded, sizeof(double));
    tensor::Tensor all = tensor::Tensor::empty({n}, DType::I64);
    tp.group->allgather(mine, all)->wait();
    sharded = 0;
    for (int r = 0; r < n; ++r) {
      double v;
      std::memcpy(&v, static_cast<const char*>(all.data_ptr()) + r * sizeof(double), sizeof(v));
      sharded += v;
    }
  }
  return std::sqrt(sharded + optim::grad_sum_of_squares(s.replicated));
}

double tp_clip_grad_norm(models::CausalLM& model, double max_norm) {
  const double norm = tp_global_grad_norm(model);
  if (!std::isfinite(norm)) return norm;
  const float coef = optim::clip_coefficient(norm, max_norm);
  if (coef < 1.f) {
    std::vector<tensor::Tensor> grads;
    for (auto& [name, p] : model.named_parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    optim::scale_grads(grads, coef);
  }
  return norm;
}

}  // namespace strata::parallel
