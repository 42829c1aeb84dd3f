// The metrics file (Note [Metrics file] in runtime/metrics.h): a resume keeps the records of
// the steps its checkpoint covers and drops the rest, including lines that are not records.
#include "runtime/metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/support/temp_dir.h"

namespace strata::runtime {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

TEST(MetricsFile, AResumeKeepsTheCheckpointsRecordsAndDropsEverythingElse) {
  TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  StepRecord r;
  r.loss = 2.5f;
  r.step = 1;
  const std::string one = to_json_line(r);
  r.step = 2;
  const std::string two = to_json_line(r);
  r.step = 3;
  const std::string three = to_json_line(r);
  // Records past the checkpoint, and lines no run writes: a step that is a string, a fraction
  // or missing, JSON that is not an object, and a torn last line. A string "step" used to throw
  // nlohmann's type_error out of the Trainer's constructor.
  write_bytes(path, one + "\n{\"step\": \"2\"}\n[1, 2]\n\n" + two + "\n{\"step\": 1.5}\n" +
                        "{\"loss\": 1}\n" + three + "\n" + three.substr(0, 10));
  {
    MetricsFile m(path, 2);
    r.step = 3;
    r.loss = 1.25f;
    m.append(r);
  }
  EXPECT_EQ(read_bytes(path), one + "\n" + two + "\n" + to_json_line(r) + "\n");
  // keep_through = 0: a fresh file.
  { MetricsFile m(path, 0); }
  EXPECT_EQ(read_bytes(path), "");
}

}  // namespace
}  // namespace strata::runtime
