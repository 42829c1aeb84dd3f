#include "data/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace strata::data {

struct DataLoader::PermutationCache {
  std::mutex mu;
  // The two most recent epochs: a batch straddling an epoch boundary touches both.
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> entries;
};

namespace {

// "<config file>: <key>", or the key alone when no file sets it.
std::string where(const DataLoaderOptions& o) {
  return o.config_file.empty() ? o.config_key : fmt::format("{}: {}", o.config_file, o.config_key);
}

// glob(3)'s error callback has no user pointer: the first directory it could not read, and why.
// A directory that does not exist (ENOENT) is no error: the pattern then matches nothing, which
// gets the "no token shards" message below, not a claim that something is unreadable.
thread_local std::string glob_failed_path;
thread_local int glob_failed_errno = 0;

int on_glob_error(const char* path, int err) {
  if (err == ENOENT || err == ENOTDIR) return 0;
  glob_failed_path = path;
  glob_failed_errno = err;
  return 1;  // stop: glob returns GLOB_ABORTED
}

std::vector<std::string> glob_sorted(const DataLoaderOptions& o) {
  glob_t g{};
  glob_failed_path.clear();
  glob_failed_errno = 0;
  const int rc = ::glob(o.pattern.c_str(), GLOB_TILDE, on_glob_error, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    // A relative pattern is taken from the working directory, not from the config's folder: a
    // run started elsewhere (configs/default.yaml expects the repository root) lands here.
    std::error_code ec;
    const std::string cwd = std::filesystem::current_path(ec).string();
    const bool relative = o.pattern[0] != '/' && o.pattern[0] != '~';  // not empty: checked
    const std::string from = relative && !ec
                                 ? fmt::format(
                                       " (a relative path, looked up from the working directory "
                                       "'{}', not from the config's folder)",
                                       cwd)
                                 : "";
    user_error(
        "{}: no token shards match '{}'{}; create them with `tokenize --output DIR ...` and "
        "point {} at e.g. DIR/train_*.bin",
        where(o), o.pattern, from, o.config_key);
  }
  if (rc == GLOB_ABORTED && !glob_failed_path.empty())
    user_error(
        "{}: cannot expand '{}': directory '{}' cannot be read ({}); fix that directory or point "
        "{} at shards elsewhere",
        where(o), o.pattern, glob_failed_path, std::strerror(glob_failed_errno), o.config_key);
  if (rc != 0) user_error("{}: cannot expand '{}' (glob error {})", where(o), o.pattern, rc);
  // glob(3) sorts with the locale's collation; shard order must not depend on the locale.
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

DataLoader::DataLoader(DataLoaderOptions options)
    : options_(std::move(options)), cache_(std::make_unique<PermutationCache>()) {
  const auto& o = options_;
  STRATA_USER_CHECK(!o.pattern.empty(), "{}: no data path given; set it to a glob of token shards",
                    where(o));
  STRATA_USER_CHECK(o.seq_len > 0, "{}: seq_len must be positive, got {}", o.config_key, o.seq_len);
  STRATA_USER_CHECK(o.vocab_size > 0, "{}: the model's vocab_size must be positive, got {}",
                    o.config_key, o.vocab_size);
  files_ = glob_sorted(o);
  shards_.reserve(files_.size());
  first_sample_.push_back(0);
  for (const std::string& f : files_) {
    TokenShard shard(f);
    if (shard.vocab_size_hint() > o.vocab_size)
      user_error(
          "{}: data and model disagree: the shard was tokenized with a vocabulary of {} but the "
          "model's vocab_size is {} (tokenized with a larger vocabulary?); re-tokenize or enlarge "
          "the model's vocab_size ({})",
          f, shard.vocab_size_hint(), o.vocab_size, o.config_key);
    // Windows j with T*j + T + 1 <= size, i.e. j <= (size - T - 1) / T.
    const int64_t windows = shard.size() > o.seq_len ? (shard.size() - 1) / o.seq_len : 0;
    if (windows == 0)
      user_error(
          "{}: only {} tokens, too short for one sample of seq_len {} (needs {}); lower seq_len "
          "or remove the shard from {}",
          f, shard.size(), o.seq_len, o.seq_len + 1, o.config_key);
    first_sample_.push_back(first_sample_.back() + windows);
    shards_.push_back(std::move(shard));
  }
  num_samples_ = first_sample_.back();
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  const RngKey key{seed, rng_stream(0xda7a, static_cast<uint64_t>(epoch))};
  for (int64_t i = n - 1; i > 0; --i) {
    auto r = philox4x32(key, static_cast<uint64_t>(i));
    const uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    // Lemire's multiply-shift maps 64 random bits onto [0, i]; bias < (i+1) / 2^64.
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(x) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto& entries = cache_->entries;
  for (auto& [e, p] : entries)
    if (e == epoch) return p;
  auto p = std::make_shared<const std::vector<int64_t>>(
      epoch_permutation(num_samples_, options_.seed, epoch));
  if (entries.size() == 2) entries.erase(entries.begin());
  entries.emplace_back(epoch, p);
  return p;
}

int64_t DataLoader::sample_at(int64_t g) const {
  STRATA_CHECK(g >= 0, "negative sample position {}", g);
  const int64_t slot = g % num_samples_;
  if (!options_.shuffle) return slot;
  return (*permutation(g / num_samples_))[slot];
}

Batch DataLoader::batch(int64_t first, int64_t n) const {
  STRATA_CHECK(first >= 0 && n > 0, "batch(first={}, n={})", first, n);
  const int64_t T = options_.seq_len;
  Batch b{tensor::Tensor::empty({n, T}, DType::I32), tensor::Tensor::empty({n, T}, DType::I32)};
  int32_t* ids = b.ids.data<int32_t>();
  int32_t* targets = b.targets.data<int32_t>();
  std::shared_ptr<const std::vector<int64_t>> perm;
  int64_t perm_epoch = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = first + i;
    const int64_t epoch = g / num_samples_;
    int64_t sample = g % num_samples_;
    if (options_.shuffle) {
      if (epoch != perm_epoch) {
        perm = permutation(epoch);
        perm_epoch = epoch;
      }
      sample = (*perm)[sample];
    }
    const auto s =
        static_cast<size_t>(std::upper_bound(first_sample_.begin(), first_sample_.end(), sample) -
                            first_sample_.begin() - 1);
    const int64_t start = T * (sample - first_sample_[s]);
    const uint16_t* tok = shards_[s].data() + start;
    for (int64_t t = 0; t <= T; ++t) {
      if (tok[t] >= options_.vocab_size)
        user_error(
            "{}: token {} at offset {} is outside the model's vocabulary of {}: data and model "
            "disagree (tokenized with a larger vocabulary?)",
            shards_[s].path(), tok[t], start + t, options_.vocab_size);
    }
    for (int64_t t = 0; t < T; ++t) {
      ids[i * T + t] = tok[t];
      targets[i * T + t] = tok[t + 1];
    }
  }
  return b;
}

}  // namespace strata::data
