#include "tensor/safetensors.h"

#include "core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "offload/checksum.h"

namespace strata::tensor {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts would need byte swapping");

namespace {

using nlohmann::json;

// The safetensors reference implementation refuses larger headers too.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string_view st_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U16:
      return "U16";
    case DType::U8:
      return "U8";
  }
  return "?";
}

bool parse_st_dtype(std::string_view s, DType& out) {
  for (DType t :
       {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16, DType::U8})
    if (st_dtype_name(t) == s) {
      out = t;
      return true;
    }
  return false;
}

template <typename... Args>
[[noreturn]] void malformed(const std::string& path, fmt::format_string<Args...> f,
                            Args&&... args) {
  user_error("{}: not a valid safetensors file: {}", path,
             fmt::format(f, std::forward<Args>(args)...));
}

// Note [Safetensors digests].
constexpr std::string_view kHeaderDigestKey = "strata.header_digest";
constexpr std::string_view kDigestPrefix = "strata.digest.";
constexpr size_t kDigestBlock = size_t{1} << 20;

bool is_digest_key(std::string_view key) {
  return key == kHeaderDigestKey || key.starts_with(kDigestPrefix);
}

std::string hex_digest(uint64_t d) {
  return fmt::format("{:016x}", d);
}

bool parse_hex_digest(const std::string& s, uint64_t& out) {
  if (s.size() != 16) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// checksum64 of the little-endian checksum64s of 1 MiB blocks, fed in pieces of any size. Whole
// blocks fed in place are summed by the OpenMP threads, each block on its own.
class BlockDigest {
 public:
  void feed(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      if (pending_.empty() && bytes >= kDigestBlock) {  // whole blocks in place
        const int64_t n = static_cast<int64_t>(bytes / kDigestBlock);
        const size_t first = sums_.size();
        sums_.resize(first + static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n >= 4)
        for (int64_t b = 0; b < n; ++b)
          sums_[first + static_cast<size_t>(b)] =
              offload::checksum64(p + static_cast<size_t>(b) * kDigestBlock, kDigestBlock);
        p += static_cast<size_t>(n) * kDigestBlock;
        bytes -= static_cast<size_t>(n) * kDigestBlock;
        continue;
      }
      const size_t take = std::min(bytes, kDigestBlock - pending_.size());
      pending_.append(p, take);
      p += take;
      bytes -= take;
      if (pending_.size() == kDigestBlock) {
        sums_.push_back(offload::checksum64(pending_.data(), pending_.size()));
        pending_.clear();
      }
    }
  }
  uint64_t finish() {
    if (!pending_.empty() || sums_.empty())
      sums_.push_back(offload::checksum64(pending_.data(), pending_.size()));
    pending_.clear();
    return offload::checksum64(sums_.data(), sums_.size() * sizeof(uint64_t));
  }

 private:
  std::string pending_;
  std::vector<uint64_t> sums_;
};

uint64_t tensor_digest(const void* data, size_t bytes) {
  BlockDigest d;
  d.feed(data, bytes);
  return d.finish();
}

// The header's content in a canonical form: entries in file order (ties by name), then the
// metadata by key without the header digest itself.
uint64_t header_digest(std::vector<const SafetensorsEntry*> entries,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
            });
  std::string text;
  for (const SafetensorsEntry* e : entries) {
    text += e->name;
    text += '\0';
    text += st_dtype_name(e->dtype);
    text += '\0';
    for (int64_t d : e->shape) text += fmt::format("{},", d);
    text += fmt::format("{}{}{}{}\n", '\0', e->begin, '\0', e->end);
  }
  text += "--\n";
  for (const auto& [k, v] : metadata) {
    if (k == kHeaderDigestKey) continue;
    text += k;
    text += '\0';
    text += v;
    text += '\n';
  }
  return offload::checksum64(text.data(), text.size());
}

[[noreturn]] void damaged(const std::string& path, std::string_view what) {
  user_error(
      "{}: {} does not match the digest written with it: the file was damaged or changed after "
      "it was written (Note [Safetensors digests]); restore it from a copy, or use another "
      "checkpoint",
      path, what);
}

}  // namespace

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) user_error("{}: cannot open for reading ({})", path_, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8)
    malformed(path_, "{} bytes is too short for the 8-byte header length", file_size);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (header_len > file_size - 8 || header_len > kMaxHeaderBytes)
    malformed(path_, "header length {} does not fit in a file of {} bytes", header_len, file_size);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in) malformed(path_, "could not read the {}-byte header", header_len);
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  json j = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) malformed(path_, "the header is not a JSON object");
  for (auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) malformed(path_, "__metadata__ is not an object");
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) malformed(path_, "__metadata__ value of '{}' is not a string", mk);
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      malformed(path_, "entry '{}' needs dtype, shape and data_offsets", key);
    SafetensorsEntry e;
    e.name = key;
    const json& dt = value["dtype"];
    if (!dt.is_string() || !parse_st_dtype(dt.get<std::string>(), e.dtype))
      malformed(path_,
                "entry '{}' has unsupported dtype {} (supported: F32, BF16, F16, I32, I64, "
                "U16, U8)",
                key, dt.dump());
    const json& shape = value["shape"];
    if (!shape.is_array() || shape.size() > static_cast<size_t>(kMaxDims))
      malformed(path_, "entry '{}' has a bad shape {}", key, shape.dump());
    // Every dim, and the bytes of the non-zero dims' product, must fit int64: a product that
    // wraps would pass the size check below with an empty data range.
    uint64_t numel = 1, span = dtype_size(e.dtype);
    for (const json& d : shape) {
      if (!d.is_number_unsigned())
        malformed(path_, "entry '{}' has a bad shape {}", key, shape.dump());
      const uint64_t n = d.get<uint64_t>();
      if (n != 0 && (__builtin_mul_overflow(span, n, &span) ||
                     span > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
        malformed(path_, "entry '{}' has shape {}, more bytes than a file can hold", key,
                  shape.dump());
      e.shape.push_back(static_cast<int64_t>(n));
      numel *= n;
    }
    const json& off = value["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      malformed(path_, "entry '{}' has bad data_offsets {}", key, off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      malformed(path_, "entry '{}' data_offsets [{}, {}] fall outside the {}-byte data section",
                key, e.begin, e.end, data_size);
    if (e.end - e.begin != numel * dtype_size(e.dtype))
      malformed(path_, "entry '{}' has {} bytes but shape {} of {} needs {}", key, e.end - e.begin,
                e.shape.str(), st_dtype_name(e.dtype), numel * dtype_size(e.dtype));
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries_.size(); ++i)
    if (entries_[i].begin < entries_[i - 1].end)
      malformed(path_, "the data of '{}' and '{}' overlap", entries_[i - 1].name, entries_[i].name);

  // Note [Safetensors digests].
  size_t tensor_digests = 0;
  for (const auto& [key, value] : metadata_) {
    if (!key.starts_with(kDigestPrefix)) continue;
    const std::string name = key.substr(kDigestPrefix.size());
    auto e = std::find_if(entries_.begin(), entries_.end(),
                          [&](const SafetensorsEntry& x) { return x.name == name; });
    uint64_t d = 0;
    if (e == entries_.end() || !parse_hex_digest(value, d))
      malformed(path_, "metadata '{}' names no tensor or is not a 16-digit hex digest", key);
    e->digest = d;
    ++tensor_digests;
  }
  auto hd = metadata_.find(std::string(kHeaderDigestKey));
  if (hd == metadata_.end()) {
    if (tensor_digests > 0)
      malformed(path_, "it has tensor digests but no '{}' (Note [Safetensors digests])",
                kHeaderDigestKey);
    return;
  }
  uint64_t want = 0;
  if (!parse_hex_digest(hd->second, want))
    malformed(path_, "metadata '{}' is not a 16-digit hex digest", kHeaderDigestKey);
  for (const SafetensorsEntry& e : entries_)
    if (!e.digest) malformed(path_, "tensor '{}' has no digest beside the header digest", e.name);
  std::vector<const SafetensorsEntry*> ptrs;
  for (const SafetensorsEntry& e : entries_) ptrs.push_back(&e);
  if (header_digest(ptrs, metadata_) != want) damaged(path_, "its header");
  has_digests_ = true;
}

bool SafetensorsReader::contains(std::string_view name) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const SafetensorsEntry& e) { return e.name == name; });
}

const SafetensorsEntry& SafetensorsReader::entry(std::string_view name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return e;
  user_error("{}: no tensor named '{}'", path_, name);
}

Tensor SafetensorsReader::read(std::string_view name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end == e.begin) return t;
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
  if (!in) user_error("{}: could not read the data of '{}' (file truncated?)", path_, name);
  if (e.digest && tensor_digest(t.data_ptr(), e.end - e.begin) != *e.digest)
    damaged(path_, fmt::format("tensor '{}'", name));
  return t;
}

void SafetensorsReader::read_into(std::string_view name, Tensor dst, uint64_t element_begin) const {
  const SafetensorsEntry& e = entry(name);
  STRATA_CHECK(dst.device().is_cpu() && dst.is_contiguous() && dst.dtype() == e.dtype,
               "{}: read '{}' ({}) into {}", path_, name, dtype_name(e.dtype), dst.str());
  const uint64_t size = dtype_size(e.dtype);
  const uint64_t begin = e.begin + element_begin * size;
  const uint64_t bytes = static_cast<uint64_t>(dst.numel()) * size;
  STRATA_CHECK(begin + bytes <= e.end, "{}: elements [{}, {}) of '{}' ({} elements)", path_,
               element_begin, element_begin + dst.numel(), name, (e.end - e.begin) / size);
  if (bytes == 0) return;
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + begin));
  in.read(static_cast<char*>(dst.data_ptr()), static_cast<std::streamsize>(bytes));
  if (!in) user_error("{}: could not read the data of '{}' (file truncated?)", path_, name);
  if (e.digest && bytes == e.end - e.begin && tensor_digest(dst.data_ptr(), bytes) != *e.digest)
    damaged(path_, fmt::format("tensor '{}'", name));
}

void SafetensorsReader::verify_entry(std::ifstream& in, std::string& buf,
                                     const SafetensorsEntry& e) const {
  if (!e.digest) return;
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  BlockDigest d;
  for (uint64_t left = e.end - e.begin; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (!in) user_error("{}: could not read the data of '{}' (file truncated?)", path_, e.name);
    d.feed(buf.data(), n);
    left -= n;
  }
  if (d.finish() != *e.digest) damaged(path_, fmt::format("tensor '{}'", e.name));
}

void SafetensorsReader::verify() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) user_error("{}: cannot open for reading ({})", path_, std::strerror(errno));
  std::string buf(64 * kDigestBlock, '\0');  // 64 blocks per read, summed in parallel
  for (const SafetensorsEntry& e : entries_) verify_entry(in, buf, e);
}

void SafetensorsReader::verify(std::string_view name) const {
  const SafetensorsEntry& e = entry(name);
  std::ifstream in(path_, std::ios::binary);
  if (!in) user_error("{}: cannot open for reading ({})", path_, std::strerror(errno));
  std::string buf(static_cast<size_t>(std::min<uint64_t>(64 * kDigestBlock, e.end - e.begin)),
                  '\0');
  verify_entry(in, buf, e);
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : reader.entries()) out.emplace(e.name, reader.read(e.name));
  return out;
}

struct SafetensorsWriter::Impl {
  explicit Impl(const std::string& path) : file(path) {}
  AtomicFile file;  // Note [Atomic files]
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> meta;  // without the digests
  std::vector<uint64_t> written;
  std::vector<BlockDigest> digests;
  uint64_t data_start = 0;
  size_t header_size = 0;
  bool committed = false;

  // The header's text, padded so the data section starts 8-byte aligned as the reference writer
  // does; `final`: with the digests, else with placeholders of the same length.
  std::string header(bool final) {
    json h = json::object();
    std::map<std::string, std::string> m = meta;
    for (size_t i = 0; i < entries.size(); ++i) {
      const SafetensorsEntry& e = entries[i];
      json shape = json::array();
      for (int64_t d : e.shape) shape.push_back(d);
      h[e.name] = {{"dtype", std::string(st_dtype_name(e.dtype))},
                   {"shape", shape},
                   {"data_offsets", {e.begin, e.end}}};
      m[std::string(kDigestPrefix) + e.name] = hex_digest(final ? *entries[i].digest : 0);
    }
    std::vector<const SafetensorsEntry*> ptrs;
    for (const SafetensorsEntry& e : entries) ptrs.push_back(&e);
    m[std::string(kHeaderDigestKey)] = hex_digest(final ? header_digest(ptrs, m) : 0);
    h["__metadata__"] = m;
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }
};

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsSpec> tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::map<std::string, bool> seen;
  for (const SafetensorsSpec& t : tensors)
    STRATA_USER_CHECK(t.name != "__metadata__" && seen.emplace(t.name, true).second,
                      "{}: tensor name '{}' is reserved or repeated", path, t.name);
  impl_ = std::make_unique<Impl>(path);
  // Note [Safetensors digests]: the caller's digest entries (a file read and written again) are
  // replaced by this file's.
  for (const auto& [k, v] : metadata)
    if (!is_digest_key(k)) impl_->meta[k] = v;
  uint64_t offset = 0;
  for (SafetensorsSpec& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
    impl_->entries.push_back({std::move(t.name), t.dtype, t.shape, offset, offset + n, 0});
    offset += n;
  }
  impl_->written.assign(impl_->entries.size(), 0);
  impl_->digests.resize(impl_->entries.size());
  const std::string text = impl_->header(/*final=*/false);
  impl_->header_size = text.size();
  impl_->data_start = 8 + text.size();
  const uint64_t len = text.size();
  impl_->file.write(&len, 8);
  impl_->file.write(text.data(), text.size());  // the placeholder; commit() writes the real one
}

SafetensorsWriter::~SafetensorsWriter() = default;

const std::string& SafetensorsWriter::path() const {
  return impl_->file.path();
}

size_t SafetensorsWriter::tensors() const {
  return impl_->entries.size();
}

uint64_t SafetensorsWriter::bytes(size_t i) const {
  return impl_->entries.at(i).end - impl_->entries.at(i).begin;
}

uint64_t SafetensorsWriter::written(size_t i) const {
  return impl_->written.at(i);
}

void SafetensorsWriter::append(size_t i, const void* data, size_t n) {
  STRATA_CHECK(i < impl_->entries.size() && !impl_->committed, "{}: append to tensor {} of {}",
               path(), i, impl_->entries.size());
  const SafetensorsEntry& e = impl_->entries[i];
  uint64_t& at = impl_->written[i];
  STRATA_CHECK(at + n <= e.end - e.begin, "{}: tensor '{}' has {} bytes, {} appended after {}",
               path(), e.name, e.end - e.begin, n, at);
  if (n == 0) return;
  impl_->file.write_at(impl_->data_start + e.begin + at, data, n);
  impl_->digests[i].feed(data, n);
  at += n;
}

void SafetensorsWriter::append(size_t i, const Tensor& piece) {
  STRATA_CHECK(i < impl_->entries.size(), "{}: append to tensor {} of {}", path(), i,
               impl_->entries.size());
  STRATA_CHECK(piece.dtype() == impl_->entries[i].dtype, "{}: a {} piece of {} tensor '{}'", path(),
               dtype_name(piece.dtype()), dtype_name(impl_->entries[i].dtype),
               impl_->entries[i].name);
  const Tensor h = piece.to(Device::cpu()).contiguous();
  append(i, h.data_ptr(), h.nbytes());
}

void SafetensorsWriter::commit() {
  STRATA_CHECK(!impl_->committed, "{}: committed twice", path());
  for (size_t i = 0; i < impl_->entries.size(); ++i) {
    SafetensorsEntry& e = impl_->entries[i];
    STRATA_CHECK(impl_->written[i] == e.end - e.begin,
                 "{}: tensor '{}' is incomplete ({} of {} bytes) at commit", path(), e.name,
                 impl_->written[i], e.end - e.begin);
    e.digest = impl_->digests[i].finish();
  }
  const std::string text = impl_->header(/*final=*/true);
  STRATA_CHECK(text.size() == impl_->header_size, "{}: the header grew from {} to {} bytes", path(),
               impl_->header_size, text.size());
  impl_->file.write_at(8, text.data(), text.size());
  impl_->file.commit();
  impl_->committed = true;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.dtype(), t.shape()});
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (size_t i = 0; i < tensors.size(); ++i) writer.append(i, tensors[i].second);
  writer.commit();
}

}  // namespace strata::tensor
