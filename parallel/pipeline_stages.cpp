#include "parallel/pipeline_stages.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace strata::parallel {

models::StageLayers StagePartition::stage(int s) const {
  STRATA_CHECK(s >= 0 && s < size(), "stage {} of {}", s, size());
  int64_t begin = 0;
  for (int i = 0; i < s; ++i) begin += layers[i];
  return {begin, begin + layers[s]};
}

int64_t StagePartition::parameters(const models::ModelShape& shape, int s) const {
  int64_t n = layers.at(s) * shape.layer_parameters;
  if (s == 0) n += shape.embedding_parameters;
  if (s == size() - 1) n += shape.head_parameters;
  return n;
}

std::string StagePartition::describe(const models::ModelShape& shape) const {
  std::string out;
  for (int s = 0; s < size(); ++s) {
    const models::StageLayers l = stage(s);
    out += fmt::format("{}stage {}: layers {}-{} ({} parameters)", s ? ", " : "", s, l.begin,
                       l.end - 1, parameters(shape, s));
  }
  return out;
}

StagePartition balance_stages(const models::ModelShape& shape, int pp) {
  const int64_t n = shape.n_layer;
  STRATA_USER_CHECK(pp >= 1, "parallelism.pipeline_parallel_size must be >= 1, got {}", pp);
  STRATA_USER_CHECK(pp <= n,
                    "parallelism.pipeline_parallel_size {} is more stages than the model's {} "
                    "layers: every stage needs at least one layer",
                    pp, n);
  // best[s][i]: the smallest largest-stage cost splitting layers [0, i) into stages 0..s-1.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  auto cost = [&](int s, int64_t a, int64_t b) {  // stage s holding layers [a, b)
    int64_t c = (b - a) * shape.layer_parameters;
    if (s == 0) c += shape.embedding_parameters;
    if (s == pp - 1) c += shape.head_parameters;
    return c;
  };
  std::vector<std::vector<int64_t>> best(pp + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int64_t>> from(pp + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s)
    for (int64_t i = s; i <= n; ++i)
      // Stage s-1 holds [j, i); j runs down from i - 1 and only a strictly smaller cost
      // replaces the best, so among equal splits the later stages hold fewer layers.
      for (int64_t j = i - 1; j >= s - 1; --j) {
        if (best[s - 1][j] == kInf) continue;
        const int64_t c = std::max(best[s - 1][j], cost(s - 1, j, i));
        if (c < best[s][i]) {
          best[s][i] = c;
          from[s][i] = j;
        }
      }
  StagePartition p;
  p.layers.assign(pp, 0);
  int64_t i = n;
  for (int s = pp; s >= 1; --s) {
    const int64_t j = from[s][i];
    p.layers[s - 1] = i - j;
    i = j;
  }
  return p;
}

StagePartition explicit_stages(const std::vector<int64_t>& layers, int64_t n_layer, int pp) {
  STRATA_USER_CHECK(static_cast<int>(layers.size()) == pp,
                    "parallelism.pipeline_partition lists {} stages but "
                    "parallelism.pipeline_parallel_size is {}: give one layer count per stage",
                    layers.size(), pp);
  int64_t sum = 0;
  for (size_t s = 0; s < layers.size(); ++s) {
    STRATA_USER_CHECK(layers[s] >= 1,
                      "parallelism.pipeline_partition gives stage {} {} layers: every stage needs "
                      "at least one",
                      s, layers[s]);
    sum += layers[s];
  }
  STRATA_USER_CHECK(sum == n_layer,
                    "parallelism.pipeline_partition adds up to {} layers but the model has {}", sum,
                    n_layer);
  return StagePartition{layers};
}

models::StageLayers interleaved_stage(int64_t n_layer, int pp, int v, int rank) {
  STRATA_USER_CHECK(pp >= 1 && v >= 1 && rank >= 0 && rank < pp,
                    "rank {} of a pipeline of {} stages with {} virtual stages", rank, pp, v);
  const int64_t chunks = static_cast<int64_t>(pp) * v;
  STRATA_USER_CHECK(n_layer % chunks == 0,
                    "parallelism.virtual_pipeline_stages {} x pipeline_parallel_size {} = {} "
                    "chunks do not divide the model's {} layers: the interleaved schedule needs "
                    "equal chunks",
                    v, pp, chunks, n_layer);
  const int64_t len = n_layer / chunks;
  models::StageLayers s;
  s.begin = rank * len;
  s.end = s.begin + len;
  s.chunks = v;
  s.stride = v > 1 ? pp * len : 0;
  return s;
}

std::string describe_interleaved(const models::ModelShape& shape, int pp, int v) {
  std::string out;
  for (int r = 0; r < pp; ++r) {
    const models::StageLayers l = interleaved_stage(shape.n_layer, pp, v, r);
    int64_t n = v * (l.end - l.begin) * shape.layer_parameters;
    if (r == 0) n += shape.embedding_parameters;
    if (r == pp - 1) n += shape.head_parameters;
    out += fmt::format("{}rank {}: layers ", r ? ", " : "", r);
    for (int64_t c = 0; c < v; ++c)
      out += fmt::format("{}{}-{}", c ? ", " : "", l.chunk_begin(c), l.chunk_end(c) - 1);
    out += fmt::format(" ({} parameters)", n);
  }
  return out;
}

void check_pipeline_layout(int world_size, int tp, int pp) {
  STRATA_USER_CHECK(pp >= 1, "parallelism.pipeline_parallel_size must be >= 1, got {}", pp);
  STRATA_USER_CHECK(tp >= 1, "parallelism.tensor_parallel_size must be >= 1, got {}", tp);
  STRATA_USER_CHECK(static_cast<int64_t>(tp) * pp <= world_size,
                    "tensor_parallel_size {} x pipeline_parallel_size {} = {} ranks is more than "
                    "the world's {}: launch at least {} ranks or make the sizes smaller",
                    tp, pp, static_cast<int64_t>(tp) * pp, world_size,
                    static_cast<int64_t>(tp) * pp);
  STRATA_USER_CHECK(world_size % (tp * pp) == 0,
                    "the world's {} ranks do not divide into tensor_parallel_size {} x "
                    "pipeline_parallel_size {}: the world must be tp x pp x dp",
                    world_size, tp, pp);
}

}  // namespace strata::parallel
