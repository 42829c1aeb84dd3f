#pragma once
// Logging through spdlog. One named logger ("strata"); tools set the level from the CLI.
#include <spdlog/spdlog.h>

namespace strata::log {

spdlog::logger& logger();
void set_level(spdlog::level::level_enum level);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  logger().info(f, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  logger().warn(f, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  logger().error(f, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  logger().debug(f, std::forward<Args>(args)...);
}

}  // namespace strata::log
