// tensor/safetensors: round trips, the committed reference files, and malformed files.
// (Kept with the model tests, its first user; it may move to tests/tensor/.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

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
  // And a well-formed one through the same helper is accepted.
  SafetensorsReader ok(
      raw(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8, "ok"));
  EXPECT_EQ(to_float_vector(ok.read("x")), (std::vector<float>{0, 0}));
}

}  // namespace
}  // namespace strata::tensor
