#include "models/nn/embedding.h"

#include "autograd/functions.h"
#include "models/nn/init.h"

namespace strata::models::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t dim)
    : num_embeddings_(num_embeddings), dim_(dim) {
  weight_ = register_parameter("weight", Shape{num_embeddings, dim});
}

void Embedding::reset_parameters(uint64_t seed) {
  init::normal_(weight_, seed, 0.f, init_std_);
}

Variable Embedding::forward(const Variable& ids) {
  return autograd::embedding(tp_.replicated(weight_), ids.data());
}

}  // namespace strata::models::nn
