// cuBLASLt tuning (Note [cuBLASLt tuning] in tensor/cuda/matmul_tuning.cpp): tuned GEMMs, with and
// without epilogues and accumulating into their output, agree with the CPU backend; a tuning file
// makes a later process take the recorded algorithms and give the same bits; bad files are clear
// errors. On the emulator (Note [Emulated cuBLASLt]) the candidates sum in different orders and
// STRATA_CUDA_EMU_CUBLASLT_FASTEST decides which one is fastest, so the choice itself is checked.
// Skips itself when no GPU is visible (CTest label `cuda`).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/support/mutate.h"
#include "tests/support/tool_test_util.h"

namespace strata::tensor {
namespace {

namespace fs = std::filesystem;

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

Tensor rnd(const Shape& s, uint64_t stream) {
  return uniform(s, {91, stream}, -2.f, 2.f);
}

// Tuning back off after each test, and the emulator's speeds equal again.
class CudaMatmulTuning : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override {
    if (cuda_available()) set_cuda_matmul_tuning(false);
    set_fastest(-1);
  }
  // Note [Emulated cuBLASLt]: every candidate but `i` takes 2 ms more (-1: all alike). Nothing
  // on a real GPU.
  static void set_fastest(int i) {
#ifdef STRATA_CUDA_EMULATION
    if (i < 0)
      unsetenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST");
    else
      setenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST", std::to_string(i).c_str(), 1);
#else
    (void)i;
#endif
  }
};

// Four GEMM problems of a transformer layer in bf16 on `d`: a plain matmul, the forward linear
// with the GELU_AUX_BIAS epilogue, a weight gradient added into an existing buffer (beta = 1)
// with its bias gradient, and the GELU gradient with its bias gradient. Outputs on the CPU, f32.
std::vector<Tensor> layer_gemms(Device d) {
  const DType bf = DType::BF16;
  auto on = [&](const Tensor& t) { return t.to(bf).to(d); };
  const Tensor a = on(rnd({48, 96}, 1)), b = on(rnd({96, 40}, 2));
  const Tensor x = on(rnd({64, 32}, 3)), w = on(rnd({48, 32}, 4)), bias = on(rnd({48}, 5));
  const Tensor dy = on(rnd({64, 48}, 6)), w2 = on(rnd({48, 48}, 7));
  Tensor dweight = on(rnd({48, 32}, 8));
  std::vector<Tensor> out;
  out.push_back(matmul(a, b));
  LinearResult fwd = linear(x, w, bias, Activation::Gelu, /*save_pre=*/true);
  out.push_back(fwd.y);
  out.push_back(fwd.pre);
  out.push_back(linear_backward_weight_into(dy, x, dweight, /*with_bias=*/true));
  out.push_back(dweight);
  LinearGeluGrads g = linear_backward_gelu(dy, w2, fwd.pre, /*with_bias=*/true);
  out.push_back(g.dpre);
  out.push_back(g.dbias);
  for (Tensor& t : out) t = t.to(kCpu).to(DType::F32);
  return out;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (max_abs_diff(a[i], b[i]) != 0.0) return false;
  return true;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

TEST_F(CudaMatmulTuning, TunedGemmsAgreeWithTheCpuBackend) {
  const std::vector<Tensor> want = layer_gemms(kCpu);
  set_cuda_matmul_tuning(true);
  const std::vector<Tensor> got = layer_gemms(kGpu);
  ASSERT_EQ(got.size(), want.size());
  // bf16 outputs: one ulp of bf16 plus the rounding noise of another summation order (the
  // tolerance of tests/cuda/cuda_ops_test.cpp). The
  // accumulated weight gradient (index 4) would be off by several times dy^T x had a trial's
  // write not been undone before the next.
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(allclose(got[i], want[i], 1.0 / 128, 1e-3))
        << "output " << i << ": max |diff| " << max_abs_diff(got[i], want[i]);
  const std::vector<CudaMatmulChoice> choices = cuda_matmul_choices();
  ASSERT_GE(choices.size(), 4u) << "a matmul, a forward linear and two gradient GEMMs";
  for (const CudaMatmulChoice& c : choices) {
    SCOPED_TRACE(c.problem);
    EXPECT_FALSE(c.from_file);
    EXPECT_GE(c.candidates, 1);
    EXPECT_LT(c.chosen, c.candidates);
    EXPECT_GT(c.ms, 0.0);
  }

  // Off: the heuristic's first algorithm, nothing timed.
  set_cuda_matmul_tuning(false);
  const std::vector<Tensor> plain = layer_gemms(kGpu);
  EXPECT_TRUE(cuda_matmul_choices().empty());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(allclose(plain[i], want[i], 1.0 / 128, 1e-3)) << "output " << i;
}

#ifdef STRATA_CUDA_EMULATION
// The emulated candidates differ only in speed as the test says: tuning keeps the fast one.
TEST_F(CudaMatmulTuning, TuningKeepsTheFastestCandidate) {
  for (int fastest : {2, 1, 0}) {
    SCOPED_TRACE("fastest " + std::to_string(fastest));
    set_fastest(fastest);
    set_cuda_matmul_tuning(true);
    layer_gemms(kGpu);
    const std::vector<CudaMatmulChoice> choices = cuda_matmul_choices();
    ASSERT_GE(choices.size(), 4u);
    for (const CudaMatmulChoice& c : choices) {
      EXPECT_EQ(c.candidates, 3) << c.problem;
      EXPECT_EQ(c.chosen, fastest) << c.problem;
      EXPECT_GT(c.first_ms, 0.0);
    }
  }
}
#endif

TEST_F(CudaMatmulTuning, ATuningFileGivesALaterProcessTheSameAlgorithmsAndBits) {
  strata::testing::ScratchDir tmp;
  const std::string file = tmp / "tuning.tsv";
  set_fastest(2);  // the emulator: candidate 2 (split k) wins the first time
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> first = layer_gemms(kGpu);
  const std::vector<CudaMatmulChoice> chosen = cuda_matmul_choices();
  ASSERT_GE(chosen.size(), 4u);
  const std::vector<std::string> lines = lines_of(file);
  ASSERT_EQ(lines.size(), 2 + chosen.size()) << "a header of two lines, then one per problem";
  EXPECT_EQ(lines[0], "# strata matmul tuning v2");
  EXPECT_EQ(lines[1].rfind("# cublasLt ", 0), 0u) << lines[1];

  // A new process (set_cuda_matmul_tuning forgets everything) where another candidate would be
  // the fastest: the file's algorithms still run, and give the first run's bits.
  set_fastest(1);
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> again = layer_gemms(kGpu);
  const std::vector<CudaMatmulChoice> reread = cuda_matmul_choices();
  ASSERT_EQ(reread.size(), chosen.size());
  for (size_t i = 0; i < reread.size(); ++i) {
    EXPECT_TRUE(reread[i].from_file) << reread[i].problem;
    EXPECT_EQ(reread[i].problem, chosen[i].problem);
    EXPECT_EQ(reread[i].chosen, chosen[i].chosen) << reread[i].problem;
  }
  EXPECT_TRUE(same_bits(first, again));
  EXPECT_EQ(lines_of(file).size(), lines.size()) << "nothing new to record";
#ifdef STRATA_CUDA_EMULATION
  // Without the file the choices follow the speeds, and the bits change: the file is what kept
  // them.
  set_cuda_matmul_tuning(true);
  const std::vector<Tensor> retuned = layer_gemms(kGpu);
  for (const CudaMatmulChoice& c : cuda_matmul_choices()) EXPECT_EQ(c.chosen, 1) << c.problem;
  EXPECT_FALSE(same_bits(first, retuned));
#endif
}

// Note [CUDA matmul]: a contiguous stack of a's over one 2-D b (the LM head) runs as one GEMM of
// all the rows, with the 2-D call's bits; a stack that is not contiguous stays a strided batch.
// The problems are read from what tuning timed.
TEST_F(CudaMatmulTuning, AStackOverASharedMatrixIsOneGemm) {
  const Tensor a = rnd({4, 24, 32}, 11).to(DType::BF16), w = rnd({40, 32}, 12).to(DType::BF16);
  const Tensor g = rnd({4, 24, 40}, 13).to(DType::BF16);
  set_cuda_matmul_tuning(true);
  const Tensor ga = a.to(kGpu), gw = w.to(kGpu), gg = g.to(kGpu);
  const Tensor logits = matmul(ga, gw, false, true);  // [4, 24, 40]
  const Tensor dx = matmul(gg, gw);                   // [4, 24, 32]
  std::vector<std::string> problems;
  for (const CudaMatmulChoice& c : cuda_matmul_choices()) problems.push_back(c.problem);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].rfind("m=96 n=40 k=32 batch=1 ", 0), 0u) << problems[0];
  EXPECT_EQ(problems[1].rfind("m=96 n=32 k=40 batch=1 ", 0), 0u) << problems[1];
  EXPECT_EQ(
      max_abs_diff(
          logits.to(kCpu).to(DType::F32),
          matmul(ga.view({96, 32}), gw, false, true).view({4, 24, 40}).to(kCpu).to(DType::F32)),
      0.0);
  EXPECT_TRUE(allclose(logits.to(kCpu).to(DType::F32), matmul(a, w, false, true).to(DType::F32),
                       1.0 / 128, 1e-3));
  EXPECT_TRUE(allclose(dx.to(kCpu).to(DType::F32), matmul(g, w).to(DType::F32), 1.0 / 128, 1e-3));

  // a transposed stack: the strided batch of 4.
  set_cuda_matmul_tuning(true);
  const Tensor at = rnd({4, 32, 24}, 14).to(DType::BF16);
  const Tensor y = matmul(at.to(kGpu), gw, true, true);
  ASSERT_EQ(cuda_matmul_choices().size(), 1u);
  EXPECT_EQ(cuda_matmul_choices()[0].problem.rfind("m=24 n=40 k=32 batch=4 ", 0), 0u)
      << cuda_matmul_choices()[0].problem;
  EXPECT_TRUE(allclose(y.to(kCpu).to(DType::F32), matmul(at, w, true, true).to(DType::F32),
                       1.0 / 128, 1e-3));
}

// A CudaMatmulTuningPause: problems met inside are not timed or recorded, problems tuned before
// keep their algorithm there, and a paused problem is tuned when met again unpaused.
TEST_F(CudaMatmulTuning, APauseTimesNothingNew) {
  strata::testing::ScratchDir tmp;
  const std::string file = tmp / "tuning.tsv";
  set_fastest(2);
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> tuned = layer_gemms(kGpu);
  const size_t n = cuda_matmul_choices().size();
  const size_t lines = lines_of(file).size();
  // bf16 inputs, an f32 output: two summation orders show in its last bits.
  const Tensor a = rnd({7, 96}, 21).to(DType::BF16).to(kGpu), b = rnd({96, 40}, 22).to(DType::BF16);
  auto product = [&] {
    Tensor out = Tensor::empty({7, 40}, DType::F32, kGpu);
    matmul_out(a, b.to(kGpu), out, false, false);
    return out.to(kCpu);
  };
  Tensor paused;
  {
    const CudaMatmulTuningPause pause;
    paused = product();
    EXPECT_TRUE(same_bits(layer_gemms(kGpu), tuned)) << "the tuned algorithms still run";
    EXPECT_EQ(cuda_matmul_choices().size(), n);
    EXPECT_EQ(lines_of(file).size(), lines);
  }
  Tensor want = Tensor::empty({7, 40}, DType::F32, kCpu);
  matmul_out(a.to(kCpu), b, want, false, false);
  EXPECT_TRUE(allclose(paused, want, 1e-5, 1e-5));
  const Tensor unpaused = product();
  ASSERT_EQ(cuda_matmul_choices().size(), n + 1);
  EXPECT_EQ(cuda_matmul_choices().back().problem.rfind("m=7 n=40 k=96 batch=1 ", 0), 0u)
      << cuda_matmul_choices().back().problem;
  EXPECT_EQ(lines_of(file).size(), lines + 1);
#ifdef STRATA_CUDA_EMULATION
  // Paused, the heuristic's first (in-order sums); tuned, the fastest (split k): other bits.
  EXPECT_EQ(cuda_matmul_choices().back().chosen, 2);
  EXPECT_GT(max_abs_diff(paused, unpaused), 0.0);
#endif
}

// The UserError's message, or "" when `f` does not raise one.
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST_F(CudaMatmulTuning, BadTuningFilesAreClearErrorsOrSetAside) {
  strata::testing::ScratchDir tmp;
  set_fastest(0);  // the emulator: a problem timed again chooses what it chose the first time
  const std::string file = tmp / "tuning.tsv";
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> want = layer_gemms(kGpu);
  const std::vector<std::string> good = lines_of(file);
  ASSERT_GE(good.size(), 6u);
  auto write = [&](const std::string& text) { strata::testing::write_text(file, text); };
  auto join = [](const std::vector<std::string>& ls) {
    std::string s;
    for (const std::string& l : ls) s += l + "\n";
    return s;
  };

  // Not a tuning file: named, with the line.
  write("step,loss\n1,2.5\n");
  set_cuda_matmul_tuning(true, file);
  std::string msg = user_error_of([&] { layer_gemms(kGpu); });
  EXPECT_NE(msg.find(file + ":1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a Strata matmul tuning file"), std::string::npos) << msg;

  // A malformed line (a word missing): named with its line number.
  std::vector<std::string> bad = good;
  bad[3] = bad[3].substr(0, bad[3].rfind(' '));
  write(join(bad));
  set_cuda_matmul_tuning(true, file);
  msg = user_error_of([&] { layer_gemms(kGpu); });
  EXPECT_NE(msg.find(file + ":4:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("delete the file"), std::string::npos) << msg;

  // A last line cut short (a crash while writing): dropped, the rest used, the file whole again.
  std::string torn = join(good);
  torn.resize(torn.size() - 10);
  write(torn);
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> after = layer_gemms(kGpu);
#ifdef STRATA_CUDA_EMULATION
  EXPECT_TRUE(same_bits(after, want));
#else
  // A GPU may time the cut line's problem differently and pick another algorithm.
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(allclose(after[i], want[i], 1.0 / 128, 1e-3)) << "output " << i;
#endif
  {
    std::ifstream in(file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
  }
  const std::vector<CudaMatmulChoice> after_torn = cuda_matmul_choices();
  int timed = 0;
  for (const CudaMatmulChoice& c : after_torn) timed += c.from_file ? 0 : 1;
  EXPECT_EQ(timed, 1) << "only the problem of the cut line is timed again";
  EXPECT_EQ(lines_of(file).size(), good.size());

#ifdef STRATA_CUDA_EMULATION
  // A recorded algorithm cuBLASLt refuses is timed again and appended, and the new line wins:
  // - refused by cublasLtMatmulAlgoCheck (here the emulator's fourth summation order, which it
  //   does not have: algorithm word 6);
  // - accepted by AlgoCheck but refused by cublasLtMatmul (here an alignment of 2^36 bytes asked
  //   of D, word 4, which AlgoCheck, seeing no pointers, cannot know). This one used to fail the
  //   GEMM with an InternalError; a trial run before it is used now finds it.
  for (const auto& [word, value] : {std::pair<int, const char*>{6, "0000000000000003"},
                                    std::pair<int, const char*>{4, "0000001000000000"}}) {
    SCOPED_TRACE(::testing::Message() << "algorithm word " << word << " = " << value);
    std::vector<std::string> refused = good;
    std::vector<std::string> words;
    std::istringstream ls(refused[2]);
    for (std::string w; ls >> w;) words.push_back(w);
    ASSERT_EQ(words.size(), 16u + 1 + 8 + 2);  // the Key (matmul_tuning.h), rank, algo, times
    words[16 + 1 + word] = value;
    refused[2].clear();
    for (const std::string& w : words) refused[2] += (refused[2].empty() ? "" : " ") + w;
    write(join(refused));
    set_cuda_matmul_tuning(true, file);
    EXPECT_TRUE(same_bits(layer_gemms(kGpu), want));
    int retimed = 0;
    for (const CudaMatmulChoice& c : cuda_matmul_choices()) retimed += c.from_file ? 0 : 1;
    EXPECT_EQ(retimed, 1);
    EXPECT_EQ(lines_of(file).size(), good.size() + 1);
    set_cuda_matmul_tuning(true, file);
    layer_gemms(kGpu);
    for (const CudaMatmulChoice& c : cuda_matmul_choices()) EXPECT_TRUE(c.from_file) << c.problem;
  }
#endif

  // Made for another cuBLASLt or GPU: moved aside, tuning starts over in a new file.
  std::vector<std::string> other = good;
  other[1] = "# cublasLt 1 sm_70 Some Older GPU";
  write(join(other));
  set_cuda_matmul_tuning(true, file);
  layer_gemms(kGpu);
  for (const CudaMatmulChoice& c : cuda_matmul_choices()) EXPECT_FALSE(c.from_file) << c.problem;
  ASSERT_TRUE(fs::exists(file + ".old"));
  EXPECT_EQ(lines_of(file + ".old"), other);
  const std::vector<std::string> fresh = lines_of(file);
  ASSERT_EQ(fresh.size(), good.size());
  EXPECT_EQ(fresh[1], good[1]);

  // A path that cannot be written: named.
  set_cuda_matmul_tuning(true, tmp / "no_such_dir/tuning.tsv");
  msg = user_error_of([&] { layer_gemms(kGpu); });
  EXPECT_NE(msg.find("cannot be written"), std::string::npos) << msg;
}

// Note [Hostile input tests] (tests/support/mutate.h): mutants of a tuning file (a word or a
// number changed, a line cut, repeated or lost, the header broken) are used or refused with a
// UserError naming the file, never another exception or a bad GEMM: whatever algorithms the
// mutant leads to, the GEMMs must still give the CPU backend's values.
TEST_F(CudaMatmulTuning, MutatedTuningFilesAreUsedOrRefused) {
  strata::testing::ScratchDir tmp;
  set_fastest(0);
  const std::string file = tmp / "tuning.tsv";
  set_cuda_matmul_tuning(true, file);
  const std::vector<Tensor> want = layer_gemms(kGpu);
  std::string good;
  {
    std::ifstream in(file);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(good.empty());
  const std::vector<Tensor> cpu = layer_gemms(kCpu);
  const int n = ::strata::testing::hostile_iterations(60);
  const auto tally = ::strata::testing::check_hostile("matmul tuning file", file, good, n, 41, [&] {
    fs::remove(file + ".old");
    set_cuda_matmul_tuning(true, file);
    const std::vector<Tensor> got = layer_gemms(kGpu);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(allclose(got[i], cpu[i], 1.0 / 64, 1e-2)) << "output " << i;
  });
  std::printf("matmul tuning file: %d mutants used, %d refused\n", tally.accepted, tally.refused);
  if (n >= 50) {
    EXPECT_GT(tally.refused, 0);
    EXPECT_GT(tally.accepted, 0);
  }
}

}  // namespace
}  // namespace strata::tensor
