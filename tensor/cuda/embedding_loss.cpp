// The CUDA backend's embedding and cross-entropy (kernels in embedding_loss.cu).
#include "tensor/cuda/cuda_backend.h"

#include "core/error.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"

namespace strata::tensor::cuda {

void CudaBackend::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  OpScope prof(stream_, "embedding_forward", 0, bytes_of({&ids, &out, &out}));
  const int64_t n = ids.numel();
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "embedding: a token id is outside [0, {}); the data does not fit this model's vocab_size "
      "(check the tokenizer and the dataset)",
      weight.size(0)));
  launch_embedding_forward(
      weight.data_ptr(), ids.data_ptr(), ids.dtype() == DType::I64, out.data_ptr(), n,
      weight.size(0), weight.size(1) * static_cast<int64_t>(weight.element_size()), bad, stream_);
  check_launch("embedding_forward");
}

// Note [CUDA embedding backward] (embedding_loss.cu): sorted on the device, no host wait.
void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  OpScope prof(stream_, "embedding_backward", 0, bytes_of({&ids, &dout, &dout}));
  const int64_t n = ids.numel(), vocab = dweight.size(0);
  if (n == 0) return;
  STRATA_CHECK(n <= (int64_t{1} << 32) && vocab < (int64_t{1} << 32) - 1,
               "CUDA embedding_backward: {} rows of a vocabulary of {}; the sort keys hold at "
               "most 2^32 of each",
               n, vocab);
  Tensor keys = scratch(embedding_sort_keys(n) * static_cast<int64_t>(sizeof(uint64_t)));
  int* bad = checked_launch(
      fmt::format("embedding_backward: a token id is outside [0, {}); the data does not fit this "
                  "model's vocab_size",
                  vocab));
  launched(launch_embedding_backward(ids.data_ptr(), ids.dtype() == DType::I64, n, vocab,
                                     static_cast<uint64_t*>(keys.data_ptr()), dout.data_ptr(),
                                     compute_dt("embedding_backward", dout), dweight.data_ptr(),
                                     compute_dt("embedding_backward", dweight), dweight.size(1),
                                     bad, stream_),
           "embedding_backward");
}

namespace {

// The cross-entropy kernels number a row's columns in 32 bits (Note [CUDA cross-entropy]).
void check_row_length(const Tensor& logits, const char* op) {
  STRATA_CHECK(logits.size(1) < (int64_t{1} << 31),
               "CUDA {}: rows of {} logits; the kernels take rows of fewer than 2^31", op,
               logits.size(1));
}

}  // namespace

void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, int64_t classes, Tensor& losses,
                                        Tensor& lse) {
  OpScope prof(stream_, "cross_entropy_forward", 0, bytes_of({&logits, &targets, &losses, &lse}));
  check_row_length(logits, "cross_entropy_forward");
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "cross_entropy: a target is outside [0, {}) and is not the ignore_index {}; check the "
      "dataset against vocab_size",
      classes, ignore_index));
  launched(launch_cross_entropy_forward(compute_dt("cross_entropy", logits), logits.data_ptr(),
                                        targets.data_ptr(), targets.dtype() == DType::I64,
                                        ignore_index, losses.data<float>(), lse.data<float>(), n, v,
                                        classes, bad, stream_),
           "cross_entropy_forward");
}

void CudaBackend::cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) {
  OpScope prof(stream_, "cross_entropy_norm", 0, bytes_of({&targets, &out}));
  launch_cross_entropy_norm(targets.data_ptr(), targets.dtype() == DType::I64, targets.numel(),
                            ignore_index, out.data<float>(), stream_);
  check_launch("cross_entropy_norm");
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, const Tensor& dloss,
                                         int64_t ignore_index, int64_t classes, Tensor& dlogits) {
  OpScope prof(stream_, "cross_entropy_backward", 0, bytes_of({&logits, &targets, &lse, &dlogits}));
  // Targets were validated by the forward; an out-of-range one here only misses its one-hot.
  check_row_length(logits, "cross_entropy_backward");
  launched(launch_cross_entropy_backward(compute_dt("cross_entropy_backward", logits, dlogits),
                                         logits.data_ptr(), targets.data_ptr(),
                                         targets.dtype() == DType::I64, lse.data<float>(),
                                         dloss.data<float>(), ignore_index, dlogits.data_ptr(),
                                         logits.size(0), logits.size(1), classes, stream_),
           "cross_entropy_backward");
}

void CudaBackend::cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                      int64_t classes, float grad, const Tensor& norm,
                                      Tensor& losses, Tensor& lse) {
  // Reads the logits once and writes them once (Note [CUDA fused cross-entropy]; twice with
  // STRATA_CE_ROW_CACHE=off or rows too wide for its register cache).
  OpScope prof(stream_, "cross_entropy_fused", 0,
               bytes_of({&logits, &targets, &losses, &lse, &logits}));
  check_row_length(logits, "cross_entropy_fused");
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "cross_entropy: a target is outside [0, {}) and is not the ignore_index {}; check the "
      "dataset against vocab_size",
      classes, ignore_index));
  launched(launch_cross_entropy_fused(
               compute_dt("cross_entropy", logits), logits.data_ptr(), targets.data_ptr(),
               targets.dtype() == DType::I64, ignore_index, losses.data<float>(), lse.data<float>(),
               n, v, classes, bad, grad, norm.data<float>(), ce_row_cache(), stream_),
           "cross_entropy_fused");
}

}  // namespace strata::tensor::cuda
