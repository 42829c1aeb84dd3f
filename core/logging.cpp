#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace strata::log {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("strata");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    return l;
  }();
  return *instance;
}

void set_level(spdlog::level::level_enum level) {
  logger().set_level(level);
}

}  // namespace strata::log
