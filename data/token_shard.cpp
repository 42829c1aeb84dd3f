#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"

namespace strata::data {

// The format is little-endian; reading it through plain loads is only right on such hosts.
static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; add byte swapping for big-endian hosts");

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) user_error("{}: cannot open token shard ({})", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    user_error("{}: cannot stat token shard ({})", path_, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    user_error("{}: is not a regular file; expected a token shard (.bin)", path_);
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kTokenShardHeaderBytes) {
    ::close(fd);
    user_error(
        "{}: is not a token shard: {} bytes is too short for the {}-byte header (llm.c/nanoGPT "
        ".bin format)",
        path_, file_bytes, kTokenShardHeaderBytes);
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) user_error("{}: cannot mmap token shard ({})", path_, std::strerror(err));
  map_ = map;
  map_bytes_ = static_cast<size_t>(file_bytes);

  try {
    std::array<int32_t, 4> h{};
    std::memcpy(h.data(), map_, sizeof(h));
    if (h[0] != kTokenShardMagic)
      user_error("{}: is not a token shard: magic {}, expected {} (llm.c/nanoGPT .bin format)",
                 path_, h[0], kTokenShardMagic);
    if (h[1] != kTokenShardVersion)
      user_error("{}: unsupported token shard version {} (only version {}: uint16 tokens)", path_,
                 h[1], kTokenShardVersion);
    if (h[2] <= 0)
      user_error("{}: token shard holds no tokens (header says {}); re-run tokenize", path_, h[2]);
    const int64_t held = (file_bytes - kTokenShardHeaderBytes) / 2;
    if (file_bytes != kTokenShardHeaderBytes + 2 * static_cast<int64_t>(h[2]))
      user_error(
          "{}: truncated: header says {} tokens, file holds {} ({} bytes; expected {}); "
          "re-run tokenize",
          path_, h[2], held, file_bytes, kTokenShardHeaderBytes + 2 * static_cast<int64_t>(h[2]));
    if (h[3] < 0) user_error("{}: negative vocab size {} in header[3]", path_, h[3]);
    size_ = h[2];
    vocab_size_hint_ = h[3];
    tokens_ =
        reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kTokenShardHeaderBytes);
  } catch (...) {
    unmap();
    throw;
  }
}

TokenShard::~TokenShard() {
  unmap();
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      vocab_size_hint_(std::exchange(o.vocab_size_hint_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    size_ = std::exchange(o.size_, 0);
    vocab_size_hint_ = std::exchange(o.vocab_size_hint_, 0);
  }
  return *this;
}

void TokenShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

namespace {}  // namespace

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens,
                       int32_t vocab_size) {
  STRATA_USER_CHECK(!tokens.empty(), "{}: refusing to write a token shard with no tokens", path);
  STRATA_USER_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX),
                    "{}: {} tokens do not fit one shard (header[2] is int32); use smaller shards",
                    path, tokens.size());
  STRATA_USER_CHECK(vocab_size >= 0 && vocab_size <= 65536,
                    "{}: vocab size {} does not fit uint16 tokens", path, vocab_size);
  std::array<int32_t, kTokenShardHeaderInts> header{};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  header[3] = vocab_size;

  AtomicFile file(path);  // Note [Atomic files]
  file.write(header.data(), sizeof(header));
  file.write(tokens.data(), tokens.size_bytes());
  file.commit();
}

}  // namespace strata::data
