#include "models/kv_cache.h"

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

}  // namespace strata::models
