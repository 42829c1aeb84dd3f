#include "models/kv_cache.h"

#include <cstddef>

#include "core/error.h"
#include "offload/memory_stats.h"

namespace strata::models {

namespace {
thread_local KvCache* active_cache = nullptr;
}  // namespace

KvCache*& detail::active_kv_cache() {
  return active_cache;
}

KvCache* KvCache::active() {
  return active_cache;
}

std::pair<tensor::Tensor, tensor::Tensor> KvCache::append(const tensor::Tensor& k,
                                                          const tensor::Tensor& v) {
  STRATA_CHECK(active_cache == this, "KvCache::append outside this cache's forward_cached");
  STRATA_CHECK(
      k.ndim() == 4 && k.shape() == v.shape() && k.dtype() == v.dtype() && k.device() == v.device(),
      "KvCache::append takes k and v of one [B, T, heads, D] shape, got {} and {}", k.str(),
      v.str());
  const int64_t B = k.size(0), T = k.size(1), H = k.size(2), D = k.size(3);
  STRATA_CHECK(B == batch_ && T == tokens_,
               "KvCache::append: k {} does not match the forward's ids [{}, {}]", k.str(), batch_,
               tokens_);
  if (next_ == slots_.size()) {
    // A new slot: only while the cache holds nothing, so every layer has the same positions.
    STRATA_CHECK(length_ == 0,
                 "KvCache: more attention layers appended ({}) than in the forward that filled "
                 "the cache",
                 next_ + 1);
    offload::CategoryScope scope(offload::Category::Activation);
    Slot s;
    s.k = tensor::Tensor::empty({B, capacity_, H, D}, k.dtype(), k.device());
    s.v = tensor::Tensor::empty({B, capacity_, H, D}, k.dtype(), k.device());
    slots_.push_back(std::move(s));
  }
  Slot& s = slots_[next_++];
  STRATA_CHECK(s.k.size(2) == H && s.k.size(3) == D && s.k.dtype() == k.dtype() &&
                   s.k.device() == k.device(),
               "KvCache: layer {} appends {} to a slot of {}", next_ - 1, k.str(), s.k.str());
  s.k.narrow(1, length_, T).copy_(k);
  s.v.narrow(1, length_, T).copy_(v);
  const int64_t L = length_ + T;
  return {s.k.narrow(1, 0, L).transpose(1, 2), s.v.narrow(1, 0, L).transpose(1, 2)};
}

void KvCache::keep_rows(const std::vector<int64_t>& rows) {
  STRATA_USER_CHECK(active_cache != this, "KvCache::keep_rows during this cache's forward");
  STRATA_USER_CHECK(!rows.empty(), "KvCache::keep_rows needs at least one row to keep");
  for (size_t j = 0; j < rows.size(); ++j) {
    STRATA_USER_CHECK(rows[j] >= 0 && rows[j] < batch_,
                      "KvCache::keep_rows: row {} is outside the cache's batch of {}", rows[j],
                      batch_);
    STRATA_USER_CHECK(j == 0 || rows[j] > rows[j - 1],
                      "KvCache::keep_rows takes strictly increasing rows, got {} after {}", rows[j],
                      rows[j - 1]);
  }
  const auto kept = static_cast<int64_t>(rows.size());
  for (Slot& s : slots_) {
    // Note [Dropping cache rows]: row rows[j] to row j, j <= rows[j], in increasing j.
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t from = rows[static_cast<size_t>(j)];
      if (from == j || length_ == 0) continue;
      s.k.narrow(0, j, 1).narrow(1, 0, length_).copy_(s.k.narrow(0, from, 1).narrow(1, 0, length_));
      s.v.narrow(0, j, 1).narrow(1, 0, length_).copy_(s.v.narrow(0, from, 1).narrow(1, 0, length_));
    }
    s.k = s.k.narrow(0, 0, kept);
    s.v = s.v.narrow(0, 0, kept);
  }
  batch_ = kept;
}

void KvCache::repeat_rows(int64_t n) {
  STRATA_USER_CHECK(active_cache != this, "KvCache::repeat_rows during this cache's forward");
  STRATA_USER_CHECK(n >= 1, "KvCache::repeat_rows needs n >= 1, got {}", n);
  STRATA_USER_CHECK(!slots_.empty(), "KvCache::repeat_rows on a cache no forward has filled");
  if (n == 1) return;
  std::vector<Slot> grown;
  grown.reserve(slots_.size());
  {
    offload::CategoryScope scope(offload::Category::Activation);
    for (const Slot& s : slots_) {
      tensor::Shape shape = s.k.shape();
      shape[0] = batch_ * n;
      Slot g;
      g.k = tensor::Tensor::empty(shape, s.k.dtype(), s.k.device());
      g.v = tensor::Tensor::empty(shape, s.v.dtype(), s.v.device());
      grown.push_back(std::move(g));
    }
  }
  if (length_ > 0) {
    // One strided copy per buffer: the held positions [B, length, heads, D] broadcast over a new
    // dim of n copies into the new buffer seen as [B, n, length, heads, D].
    const auto copy = [&](const tensor::Tensor& from, const tensor::Tensor& to) {
      const int64_t H = from.size(2), D = from.size(3);
      to.view({batch_, n, from.size(1), H, D})
          .narrow(2, 0, length_)
          .copy_(from.narrow(1, 0, length_).unsqueeze(1).expand({batch_, n, length_, H, D}));
    };
    for (size_t l = 0; l < slots_.size(); ++l) {
      copy(slots_[l].k, grown[l].k);
      copy(slots_[l].v, grown[l].v);
    }
  }
  slots_ = std::move(grown);
  batch_ *= n;
}

}  // namespace strata::models
