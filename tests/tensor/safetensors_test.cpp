// tensor/safetensors: round trips, the committed reference files, and malformed files.
// (Kept with the model tests, its first user; it may move to tests/tensor/.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "offload/checksum.h"
#include "tensor/safetensors.h"

namespace strata::tensor {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with the given raw header text and `data_bytes` zero bytes of data.
  std::string raw(const std::string& header, size_t data_bytes, const std::string& name = "bad") {
    std::string p = path(name + ".safetensors");
    std::ofstream f(p, std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::string zeros(data_bytes, '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    return p;
  }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeAndLayout) {
  Tensor f = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = f.transpose(0, 1);  // non-contiguous: written in logical order
  Tensor i64 = from_ints({-1, 5, 1LL << 40}, {3});
  Tensor i32 = from_ints({7, -8}, {2}, DType::I32);
  Tensor bf = from_vector({0.5f, -2.f}, {2}, DType::BF16);
  Tensor scalar = from_vector({3.f}, {});
  Tensor empty = Tensor::empty({0, 4});
  std::string p = path("a.safetensors");
  save_safetensors(p,
                   {{"f", f},
                    {"t", t},
                    {"i64", i64},
                    {"i32", i32},
                    {"bf", bf},
                    {"scalar", scalar},
                    {"empty", empty}},
                   {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(::getpid()))) << "temp file renamed away";
  SafetensorsReader r(p);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.entries().size(), 7u);
  EXPECT_EQ(r.entries()[0].name, "f") << "entries in file order";
  EXPECT_EQ(to_float_vector(r.read("f")), to_float_vector(f));
  EXPECT_EQ(r.read("t").shape(), (Shape{3, 2}));
  EXPECT_EQ(to_float_vector(r.read("t")), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(to_int_vector(r.read("i64")), to_int_vector(i64));
  EXPECT_EQ(r.read("i32").dtype(), DType::I32);
  EXPECT_EQ(to_int_vector(r.read("i32")), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(r.read("bf").dtype(), DType::BF16);
  EXPECT_EQ(to_float_vector(r.read("bf")), (std::vector<float>{0.5f, -2.f}));
  EXPECT_EQ(r.read("scalar").ndim(), 0);
  EXPECT_EQ(r.read("empty").shape(), (Shape{0, 4}));
  EXPECT_THROW(r.read("missing"), UserError);
  // The header is 8-byte aligned, as the reference implementation writes it.
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  // Overwriting replaces the file atomically.
  save_safetensors(p, {{"only", f}});
  EXPECT_EQ(SafetensorsReader(p).entries().size(), 1u);
}

TEST_F(Safetensors, ReadsThePythonWrittenReference) {
  SafetensorsReader r(std::string(STRATA_SOURCE_DIR) + "/tests/reference/gpt2_tiny.safetensors");
  EXPECT_EQ(r.entry("tokens").dtype, DType::I64);
  EXPECT_EQ(r.entry("h.0.attn.c_attn.weight").shape, (Shape{96, 32}));
  EXPECT_EQ(r.metadata().at("n_layer"), "2");
  EXPECT_EQ(load_safetensors(r.path()).size(), r.entries().size());
}

TEST_F(Safetensors, MalformedFilesAreUserErrorsNamingTheFile) {
  auto expect_bad = [&](const std::string& p, const std::string& what) {
    try {
      SafetensorsReader r(p);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  expect_bad(path("missing.safetensors"), "missing file");
  {
    std::string p = path("short.safetensors");
    std::ofstream(p) << "abc";
    expect_bad(p, "too short");
  }
  {
    std::string p = path("huge.safetensors");
    std::ofstream f(p, std::ios::binary);
    uint64_t n = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
    expect_bad(p, "header longer than the file");
  }
  expect_bad(raw("not json", 0, "a"), "not JSON");
  expect_bad(raw("[1, 2]", 0, "b"), "not an object");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [2]}})", 8, "c"), "no data_offsets");
  expect_bad(raw(R"({"x": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}})", 8, "d"),
             "bad dtype");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, "e"),
             "size does not match shape");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4, "f"),
             "data past the end");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8, "g"),
             "negative dim");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                 12, "h"),
             "overlap");
  expect_bad(raw(R"({"__metadata__": {"k": 1}})", 0, "i"), "non-string metadata");
  // Shapes whose element count wraps uint64 to 0 bytes, with an empty data range: once accepted
  // (a dim of 2^63 read back as a negative int64; 2^32 x 2^32 elements in 0 bytes).
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [9223372036854775808, 2],
                     "data_offsets": [0, 0]}})",
                 0, "j"),
             "a dim above int64");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296],
                     "data_offsets": [0, 0]}})",
                 0, "k"),
             "an element count that wraps");
  expect_bad(raw(R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 0, 4],
                     "data_offsets": [0, 0]}})",
                 0, "l"),
             "a dim of 2^62 beside a zero");
  // And a well-formed one through the same helper is accepted.
  SafetensorsReader ok(
      raw(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8, "ok"));
  EXPECT_EQ(to_float_vector(ok.read("x")), (std::vector<float>{0, 0}));
}

// Note [Safetensors digests].
class SafetensorsDigests : public Safetensors {
 protected:
  // A file with a tensor over 1 MiB (blocks and a tail), a small one and an empty one.
  std::string written(const std::string& name) {
    std::vector<float> big(300000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1013) * 0.25f;
    const std::string p = path(name);
    save_safetensors(p,
                     {{"big", from_vector(big, {300000})},
                      {"small", from_vector({1, 2, 3}, {3})},
                      {"empty", Tensor::empty({0, 2})}},
                     {{"format", "pt"}});
    return p;
  }
  static std::string bytes_of(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void put(const std::string& p, const std::string& b) {
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), b.size());
  }
  static uint64_t data_start(const std::string& b) {
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    return 8 + n;
  }
  // `f` must raise a UserError whose message holds every needle.
  template <typename F>
  static void expect_error(F&& f, const std::vector<std::string>& needles) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
};

TEST_F(SafetensorsDigests, WrittenFilesCarryThemAndReadBack) {
  const std::string p = written("a.safetensors");
  SafetensorsReader r(p);
  EXPECT_TRUE(r.has_digests());
  for (const auto& e : r.entries()) EXPECT_TRUE(e.digest.has_value()) << e.name;
  EXPECT_EQ(r.metadata().at("strata.header_digest").size(), 16u);
  EXPECT_NO_THROW(r.verify());
  EXPECT_EQ(r.read("big").numel(), 300000);
  // A file read and written again with its metadata gets this content's digests, not the old.
  std::vector<std::pair<std::string, Tensor>> ts = {{"small", from_vector({4, 5}, {2})}};
  save_safetensors(path("b.safetensors"), ts, r.metadata());
  SafetensorsReader again(path("b.safetensors"));
  EXPECT_TRUE(again.has_digests());
  EXPECT_FALSE(again.contains("big"));
  EXPECT_FALSE(again.metadata().contains("strata.digest.big"));
  EXPECT_NO_THROW(again.verify());
  EXPECT_EQ(to_float_vector(again.read("small")), (std::vector<float>{4, 5}));
}

// The digest's definition, computed here from offload::checksum64 alone: it is on disk in every
// checkpoint, so it must never change. A tensor of 4 whole blocks (summed in parallel) and a tail.
TEST_F(SafetensorsDigests, ATensorsDigestIsTheChecksumOfItsBlocksChecksums) {
  const size_t block = size_t{1} << 20;
  std::vector<float> v(4 * block / 4 + 12345);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 4099) - 7.5f;
  save_safetensors(path("d.safetensors"), {{"v", from_vector(v, {static_cast<int64_t>(v.size())})},
                                           {"e", Tensor::empty({0})}});
  const char* bytes = reinterpret_cast<const char*>(v.data());
  const size_t n = v.size() * sizeof(float);
  std::vector<uint64_t> sums;
  for (size_t at = 0; at < n; at += block)
    sums.push_back(offload::checksum64(bytes + at, std::min(block, n - at)));
  ASSERT_EQ(sums.size(), 5u);
  const uint64_t want = offload::checksum64(sums.data(), sums.size() * sizeof(uint64_t));
  const uint64_t empty_sum = offload::checksum64(nullptr, 0);
  const uint64_t want_empty = offload::checksum64(&empty_sum, sizeof(empty_sum));
  SafetensorsReader r(path("d.safetensors"));
  EXPECT_EQ(r.metadata().at("strata.digest.v"), fmt::format("{:016x}", want));
  EXPECT_EQ(r.metadata().at("strata.digest.e"), fmt::format("{:016x}", want_empty));
  EXPECT_NO_THROW(r.verify());
}

// And the header digest's canonical form, spelled out as the Note gives it.
TEST_F(SafetensorsDigests, TheHeaderDigestIsTheChecksumOfItsCanonicalForm) {
  save_safetensors(path("h.safetensors"),
                   {{"x", from_vector({1, 2, 3, 4, 5, 6}, {2, 3})}, {"e", Tensor::empty({0})}},
                   {{"format", "pt"}});
  SafetensorsReader r(path("h.safetensors"));
  const auto& m = r.metadata();
  using namespace std::string_literals;
  // "x" at [0, 24), then the empty "e" at [24, 24).
  const std::string form = "x\0F32\0"s + "2,3,\0"s + "0\0"s + "24\n"s + "e\0F32\0"s + "0,\0"s +
                           "24\0"s + "24\n"s + "--\n"s + "format\0pt\n"s + "strata.digest.e\0"s +
                           m.at("strata.digest.e"s) + "\n"s + "strata.digest.x\0"s +
                           m.at("strata.digest.x"s) + "\n"s;
  EXPECT_EQ(m.at("strata.header_digest"),
            fmt::format("{:016x}", offload::checksum64(form.data(), form.size())));
}

TEST_F(SafetensorsDigests, AChangedByteInAnyTensorIsRefusedNamingIt) {
  const std::string p = written("a.safetensors");
  const std::string good = bytes_of(p);
  const uint64_t start = data_start(good);
  // The last byte of each tensor: "big" at 1.14 MiB (its second, short block), "small".
  for (const auto& [name, at] : std::vector<std::pair<std::string, uint64_t>>{
           {"big", 300000 * 4 - 1}, {"big", 5}, {"small", 300000 * 4 + 11}}) {
    std::string bad = good;
    bad[start + at] = static_cast<char>(bad[start + at] ^ 0x10);
    put(p, bad);
    SafetensorsReader r(p);  // the header is unchanged
    expect_error([&] { r.read(name); }, {p, "tensor '" + name + "'", "damaged or changed"});
    expect_error([&] { r.verify(); }, {p, "tensor '" + name + "'", "damaged or changed"});
    const std::string other = name == "big" ? "small" : "big";
    EXPECT_NO_THROW(r.read(other)) << "only the damaged tensor is refused";
  }
}

TEST_F(SafetensorsDigests, AChangedHeaderIsRefusedWhenOpened) {
  const std::string p = written("a.safetensors");
  const std::string good = bytes_of(p);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string b = good;
    const size_t at = b.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    b.replace(at, from.size(), to);
    put(p, b);
  };
  // A metadata value of the same length, and a shape that still matches its bytes.
  edited("\"format\":\"pt\"", "\"format\":\"tf\"");
  expect_error([&] { SafetensorsReader r(p); }, {p, "its header", "damaged or changed"});
  edited("\"shape\":[0,2]", "\"shape\":[2,0]");
  expect_error([&] { SafetensorsReader r(p); }, {p, "its header"});
  // Digest keys renamed: tensor digests without a header digest, or a tensor without one.
  edited("strata.header_digest", "strata.header_digesT");
  expect_error([&] { SafetensorsReader r(p); }, {p, "no 'strata.header_digest'"});
  edited("strata.digest.small", "strata.digest.smalL");
  expect_error([&] { SafetensorsReader r(p); }, {p, "names no tensor"});
  // The JSON's spacing is not content: the header written again with newlines and a space
  // after every comma between keys (longer, so the length word changes) still opens and reads.
  const uint64_t start = data_start(good);
  std::string header = good.substr(8, start - 8);
  header = header.substr(0, header.find_last_not_of(' ') + 1);
  std::string relaid = "{\n  " + header.substr(1, header.size() - 2) + "\n}";
  for (size_t at = 0; (at = relaid.find("\",\"", at)) != std::string::npos; at += 4)
    relaid.replace(at, 3, "\",  \"");
  ASSERT_NE(relaid.size(), header.size());
  uint64_t len = relaid.size();
  std::string b(reinterpret_cast<const char*>(&len), 8);
  b += relaid + good.substr(start);
  put(p, b);
  SafetensorsReader r(p);
  EXPECT_TRUE(r.has_digests());
  EXPECT_NO_THROW(r.verify());
  EXPECT_EQ(r.read("small").numel(), 3);
}

TEST_F(SafetensorsDigests, FilesWithoutThemAreReadUnchecked) {
  // Written raw, as other writers (and Strata before digests) do.
  SafetensorsReader r(
      raw(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8, "plain"));
  EXPECT_FALSE(r.has_digests());
  EXPECT_FALSE(r.entry("x").digest.has_value());
  EXPECT_NO_THROW(r.verify());
  EXPECT_EQ(to_float_vector(r.read("x")), (std::vector<float>{0, 0}));
  SafetensorsReader hf(std::string(STRATA_SOURCE_DIR) +
                       "/tests/reference/gpt2_hf_tiny/model.safetensors");
  EXPECT_FALSE(hf.has_digests());
}

}  // namespace
}  // namespace strata::tensor
