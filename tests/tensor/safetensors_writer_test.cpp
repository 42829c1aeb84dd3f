// tensor/safetensors: the streaming writer (Note [Streamed safetensors]) — the bytes
// save_safetensors writes, from pieces appended in any interleaving, and nothing under the final
// name unless it was committed complete.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "tensor/safetensors.h"

namespace strata::tensor {
namespace {

namespace fs = std::filesystem;

class SafetensorsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_stw_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string bytes_of(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The directory's entries (a leftover temporary shows here).
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
};

// Several dtypes, one tensor over three 1 MiB digest blocks, an empty one, a non-contiguous one.
std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  return {{"big", randn({800'000}, RngKey{3, 1})},
          {"bf", randn({5, 7}, RngKey{3, 2}).to(DType::BF16)},
          {"empty", Tensor::empty({0, 4})},
          {"ints", arange(1000, DType::I64)},
          {"t", randn({6, 9}, RngKey{3, 3}).transpose(0, 1)}};
}

TEST_F(SafetensorsWriterTest, PiecesInAnyInterleavingGiveTheBytesSaveSafetensorsWrites) {
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> meta = {{"format", "strata"}, {"step", "3"}};
  save_safetensors(path("whole.safetensors"), tensors, meta);

  std::vector<SafetensorsSpec> specs;
  std::vector<Tensor> flat;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, t.dtype(), t.shape()});
    flat.push_back(t.contiguous().flatten());
  }
  SafetensorsWriter w(path("streamed.safetensors"), specs, meta);
  // Round robin over the tensors, odd piece sizes, so the digests' blocks are fed in parts.
  const std::vector<int64_t> piece = {70'001, 3, 1, 17, 5};
  std::vector<int64_t> at(flat.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < flat.size(); ++i) {
      const int64_t n = std::min(piece[i], flat[i].numel() - at[i]);
      if (n <= 0) continue;
      if (i == 3) {  // the raw-bytes form
        const Tensor p = flat[i].narrow(0, at[i], n);
        w.append(i, p.data_ptr(), p.nbytes());
      } else {
        w.append(i, flat[i].narrow(0, at[i], n));
      }
      at[i] += n;
      more = true;
    }
  }
  EXPECT_FALSE(fs::exists(path("streamed.safetensors")));  // not before commit
  w.commit();
  const std::string a = bytes_of(path("whole.safetensors"));
  const std::string b = bytes_of(path("streamed.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);

  SafetensorsReader r(path("streamed.safetensors"));
  EXPECT_TRUE(r.has_digests());
  r.verify();
  for (const auto& [name, t] : tensors) {
    const Tensor back = r.read(name);
    ASSERT_EQ(back.shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(back.data_ptr(), t.contiguous().data_ptr(), t.nbytes())) << name;
  }
}

TEST_F(SafetensorsWriterTest, AnErrorMidWriteLeavesThePreviousFileAndNoTemporary) {
  const auto tensors = sample_tensors();
  save_safetensors(path("ckpt.safetensors"), tensors);
  const std::string before = bytes_of(path("ckpt.safetensors"));
  auto produce_then_fail = [&](const std::string& name) {
    std::vector<SafetensorsSpec> specs;
    for (const auto& [n, t] : tensors) specs.push_back({n, t.dtype(), t.shape()});
    SafetensorsWriter w(path(name), specs);
    w.append(0, tensors[0].second.narrow(0, 0, 1000));
    throw std::runtime_error("the producer failed");
  };
  EXPECT_THROW(produce_then_fail("ckpt.safetensors"), std::runtime_error);
  EXPECT_EQ(bytes_of(path("ckpt.safetensors")), before);
  EXPECT_THROW(produce_then_fail("new.safetensors"), std::runtime_error);
  EXPECT_EQ(entries(), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(SafetensorsWriterTest, CommitRefusesAnIncompleteTensorAndAppendPastItsEnd) {
  {
    SafetensorsWriter w(path("a.safetensors"), {{"x", DType::F32, Shape{4}}});
    const Tensor three = full({3}, 1.0);
    w.append(0, three);
    EXPECT_EQ(w.written(0), 12u);
    EXPECT_EQ(w.bytes(0), 16u);
    EXPECT_ANY_THROW(w.append(0, three));  // 24 bytes into 16
    EXPECT_ANY_THROW(w.commit());
  }
  EXPECT_TRUE(entries().empty());
  EXPECT_THROW(SafetensorsWriter(path("b.safetensors"),
                                 {{"x", DType::F32, Shape{1}}, {"x", DType::F32, Shape{2}}}),
               UserError);
  EXPECT_TRUE(entries().empty());
}

}  // namespace
}  // namespace strata::tensor
