#include "models/nn/vocab_parallel_embedding.h"

#include <algorithm>
#include <vector>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "models/nn/init.h"
#include "tensor/ops.h"

namespace strata::models::nn {

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t dim,
                                               const TensorParallel& tp)
    : num_embeddings_(num_embeddings), dim_(dim), tp_(tp) {
  STRATA_USER_CHECK(num_embeddings % tp.size() == 0,
                    "a vocabulary of {} rows (padded) does not split over tensor_parallel_size "
                    "{}; pad it to a multiple (padded_vocab_size)",
                    num_embeddings, tp.size());
  weight_ = register_parameter("weight", Shape{num_embeddings / tp.size(), dim});
}

void VocabParallelEmbedding::reset_parameters(uint64_t seed) {
  normal_shard_(weight_, seed, 0.f, init_std_, Shape{num_embeddings_, dim_}, {0, 1}, tp_.rank(),
                tp_.size());
}

void VocabParallelEmbedding::zero_rows_from(int64_t row) {
  const int64_t local = local_rows();
  const int64_t first = std::clamp<int64_t>(row - vocab_start(), 0, local);
  if (first == local) return;
  Tensor w = weight_.data().narrow(0, first, local - first);
  w.zero_();
}

std::vector<std::pair<std::string, ShardSpec>> VocabParallelEmbedding::shard_specs() const {
  return {{"weight", {0, 1}}};
}

Variable VocabParallelEmbedding::forward(const Variable& ids_in) {
  if (!tp_.enabled()) return autograd::embedding(weight_, ids_in.data());  // nn::Embedding's
  const Tensor& ids = ids_in.data();
  // Ids are few ([B, T] ints): the local ids and the mask are made on the host.
  const std::vector<int64_t> v = tensor::to_int_vector(ids);
  const int64_t start = vocab_start(), rows = local_rows();
  std::vector<int64_t> local(v.size(), 0);
  std::vector<float> mask(v.size(), 0.f);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] >= start && v[i] < start + rows) {
      local[i] = v[i] - start;
      mask[i] = 1.f;
    }
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  Tensor local_ids = tensor::from_ints(local, ids.shape());
  // In the table's dtype (bf16/f16 under mixed precision): 0 and 1 are exact in every one.
  Tensor mask_t = tensor::from_vector(mask, mask_shape, weight_.dtype());
  if (!ids.device().is_cpu()) {
    local_ids = local_ids.to(ids.device());
    mask_t = mask_t.to(ids.device());
  }
  Variable partial = autograd::masked_embedding(weight_, local_ids, mask_t);
  return tp_.exit(partial);
}

}  // namespace strata::models::nn
