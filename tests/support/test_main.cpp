#include <gtest/gtest.h>

#include "core/logging.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  strata::log::set_level(spdlog::level::warn);
  return RUN_ALL_TESTS();
}
