// `train` samples text during training at any layout (Note [Sampling over ranks] in
// sampling/sampler.h): with training.sample_every at tp 2 (x dp 2, with and without sequence
// parallelism, with ZeRO-3), pp 2 (x dp 2), pp 2 x tp 2 and the interleaved pp 2 x v 2, rank 0
// prints the samples the one-process run prints for the same seed, word for word, once each.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/dist/train_mpi_fixture.h"

namespace strata::tools {
namespace {

using testing::CommandResult;
using testing::describe;

class TrainSamplingMpi : public testing::TrainMpiFixture {
 protected:
  TrainSamplingMpi() : TrainMpiFixture(STRATA_BINARY_DIR, "") {}
};

// The "sample at step N:\n<text>\n---" blocks a run printed, in order, each with its header.
std::vector<std::string> samples(const std::string& out) {
  std::vector<std::string> found;
  size_t at = 0;
  while ((at = out.find("sample at step ", at)) != std::string::npos) {
    const size_t end = out.find("\n---", at);
    if (end == std::string::npos) break;
    found.push_back(out.substr(at, end - at));
    at = end;
  }
  return found;
}

TEST_F(TrainSamplingMpi, EveryLayoutPrintsTheOneProcessSamples) {
  const int kSteps = 6;
  // 4 layers, so that pp 2 x v 2 has a layer per chunk; samples at steps 3 and 6 of 12 tokens
  // each at the run's default temperature 0.8 and top_k 40.
  const std::vector<std::string> common = {"model.config.n_layer=4", "training.sample_every=3",
                                           "training.sample_tokens=12"};
  CommandResult single = train(0, config("single", kSteps), common);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<std::string> want = samples(single.out);
  ASSERT_EQ(want.size(), 2u) << single.out;
  EXPECT_NE(want[0].find("sample at step 3:\n"), std::string::npos) << want[0];
  EXPECT_NE(want[1].find("sample at step 6:\n"), std::string::npos) << want[1];

  struct Run {
    std::string name;
    int np;
    std::vector<std::string> sets;
  };
  const std::vector<Run> runs = {
      {"tp2", 4, {"parallelism.tensor_parallel_size=2"}},
      {"tp2_sp_z1",
       4,
       {"parallelism.tensor_parallel_size=2", "parallelism.sequence_parallel=true",
        "zero_optimization.stage=1"}},
      // ZeRO-3 gathers each unit around its forward: the cached steps too.
      {"tp2_z3", 4, {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=3"}},
      {"pp2", 4, {"parallelism.pipeline_parallel_size=2"}},
      {"pp2_tp2",
       4,
       {"parallelism.pipeline_parallel_size=2", "parallelism.tensor_parallel_size=2"}},
      {"pp2_v2",
       2,
       {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_schedule=interleaved",
        "parallelism.virtual_pipeline_stages=2"}},
  };
  for (const Run& run : runs) {
    std::vector<std::string> sets = common;
    sets.insert(sets.end(), run.sets.begin(), run.sets.end());
    CommandResult r = train(run.np, config(run.name, kSteps), sets);
    ASSERT_EQ(r.exit_code, 0) << run.name << ": " << describe(r);
    // Rank 0 alone prints, so each sample appears once.
    EXPECT_EQ(samples(r.out), want) << run.name << ": " << r.out;
    std::printf("[train %s, %d ranks] %zu samples, equal to one process's: %s\n", run.name.c_str(),
                run.np, samples(r.out).size(), samples(r.out) == want ? "yes" : "no");
  }
}

}  // namespace
}  // namespace strata::tools
