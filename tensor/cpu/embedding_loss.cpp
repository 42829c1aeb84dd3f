// CPU embedding lookup (and its scatter-add backward) and fused softmax + cross-entropy.
//
// Note [Deterministic embedding backward]
// Several positions may carry the same token, so dweight rows receive sums whose order must not
// depend on threads, and atomics would make it depend on timing. Threads instead split the
// columns: each owns a fixed strip of kColumnStrip columns of every dweight row and walks all
// positions in order, so every element is summed in position order by exactly one thread.
//
// Note [Cross-entropy without probabilities]
// Forward keeps only lse = log sum_j exp(logit_j) per row (loss = lse - logit_target); backward
// recomputes softmax = exp(logit - lse) on the fly, so no [N, V] probability matrix (50k wide for
// GPT-2) is ever stored. Both directions use exp4 (Note [Vectorised exp]).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/vec4.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;
constexpr int64_t kColumnStrip = 64;  // Note [Deterministic embedding backward]

// Calls f(const T* ids) with the id array typed by its dtype (I32 or I64).
template <typename F>
void with_ids(const Tensor& ids, F f) {
  if (ids.dtype() == DType::I32) {
    f(ids.data<int32_t>());
  } else {
    STRATA_CHECK(ids.dtype() == DType::I64, "expected i32/i64 ids, got {}", ids.str());
    f(ids.data<int64_t>());
  }
}

// Checked before any parallel work: an exception must not leave an OpenMP region.
template <typename T>
void check_ids(const T* ids, int64_t n, int64_t vocab, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      user_error(
          "{}: token id {} at position {} is out of range for a vocabulary of {} (ids must "
          "be in [0, {})); check that the data was tokenized for this model's vocab_size",
          op, static_cast<int64_t>(ids[i]), i, vocab, vocab);
}

template <typename T>
void check_targets(const T* t, int64_t n, int64_t vocab, int64_t ignore_index) {
  for (int64_t i = 0; i < n; ++i)
    if (t[i] != ignore_index && (t[i] < 0 || t[i] >= vocab))
      user_error(
          "cross_entropy: target {} at row {} is out of range for {} classes (targets must "
          "be in [0, {}) or equal ignore_index {}); check the data's tokenizer and the "
          "model's vocab_size",
          static_cast<int64_t>(t[i]), i, vocab, vocab, ignore_index);
}

}  // namespace

void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.numel(), vocab = weight.size(0);
  // Rows are copied as bytes, so any weight dtype works (out has the weight's dtype).
  const size_t row_bytes = static_cast<size_t>(weight.size(1)) * weight.element_size();
  const char* w = static_cast<const char*>(weight.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, vocab, "embedding");
#pragma omp parallel for schedule(static) if (n * static_cast <int64_t>(row_bytes) >= \
                                              4 * kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(o + i * row_bytes, w + static_cast<int64_t>(id[i]) * row_bytes, row_bytes);
  });
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  // Note [Widening adapter]: f32 sums in the same order, added to the old dweight, rounded once.
  if (!all_f32(dout, dweight)) {
    F32Out o(dweight, /*load=*/true);
    embedding_backward(ids, widened(dout), o.get());
    return o.commit();
  }
  const int64_t n = ids.numel(), vocab = dweight.size(0), c = dweight.size(1);
  const float* g = dout.data<float>();
  float* dw = dweight.data<float>();
  const int64_t strips = (c + kColumnStrip - 1) / kColumnStrip;
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, vocab, "embedding_backward");
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
    for (int64_t st = 0; st < strips; ++st) {
      const int64_t c0 = st * kColumnStrip, c1 = std::min(c, c0 + kColumnStrip);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = dw + static_cast<int64_t>(id[i]) * c;
        const float* src = g + i * c;
        for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
      }
    }
  });
}

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, int64_t classes, Tensor& losses,
                                       Tensor& lse) {
  if (!all_f32(logits, losses, lse)) {  // Note [Widening adapter]
    F32Out ol(losses), oe(lse);
    cross_entropy_forward(widened(logits), targets, ignore_index, classes, ol.get(), oe.get());
    ol.commit();
    return oe.commit();
  }
  // Rows are `ld` apart and only their first `v` columns take part (Backend::cross_entropy_*).
  const int64_t n = logits.size(0), ld = logits.size(1), v = classes;
  const float* x = logits.data<float>();
  float* lossp = losses.data<float>();
  float* lsep = lse.data<float>();
  with_ids(targets, [&](const auto* t) {
    check_targets(t, n, v, ignore_index);
#pragma omp parallel for schedule(static) if (n * v >= kParallelMin)
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * ld;
      const float mx = max_row(xr, v);
      // lse is written for ignored rows too: it is cheap next to the rest and always defined.
      const float l = static_cast<float>(mx + std::log(sum_exp_shifted(xr, v, mx)));
      lsep[r] = l;
      lossp[r] = t[r] == ignore_index ? 0.0f : l - xr[t[r]];
    }
  });
}

void CpuBackend::cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) {
  int64_t count = 0;
  with_ids(targets, [&](const auto* t) {
    for (int64_t r = 0; r < targets.numel(); ++r) count += t[r] != ignore_index;
  });
  const float m = static_cast<float>(std::max<int64_t>(count, 1));
  out.data<float>()[0] = m;
  out.data<float>()[1] = 1.f / m;
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& dloss,
                                        int64_t ignore_index, int64_t classes, Tensor& dlogits) {
  if (!all_f32(logits, lse, dloss, dlogits)) {  // Note [Widening adapter]
    F32Out o(dlogits);
    cross_entropy_backward(widened(logits), targets, widened(lse), widened(dloss), ignore_index,
                           classes, o.get());
    return o.commit();
  }
  const int64_t n = logits.size(0), ld = logits.size(1), v = classes;
  const float* x = logits.data<float>();
  const float* lsep = lse.data<float>();
  const float* gp = dloss.data<float>();
  float* dx = dlogits.data<float>();
  with_ids(targets, [&](const auto* t) {
    check_targets(t, n, v, ignore_index);
#pragma omp parallel for schedule(static) if (n * ld >= kParallelMin)
    for (int64_t r = 0; r < n; ++r) {
      float* dr = dx + r * ld;
      std::fill(dr + v, dr + ld, 0.0f);  // the columns that take no part
      if (t[r] == ignore_index) {
        std::fill(dr, dr + v, 0.0f);
        continue;
      }
      const float g = gp[r];
      exp_affine(x + r * ld, dr, v, 1.0f, lsep[r]);  // softmax, from lse
      const float p_target = dr[t[r]];
      for (int64_t j = 0; j < v; ++j) dr[j] *= g;
      dr[t[r]] = (p_target - 1.0f) * g;
    }
  });
}

}  // namespace strata::tensor::cpu
