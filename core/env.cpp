#include "core/env.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace strata {

std::string env_choice_error(const char* name, const std::string& value,
                             std::initializer_list<EnvChoice> choices) {
  std::string msg = fmt::format("environment variable {}={} is not a setting; use ", name, value);
  int i = 0;
  const int n = static_cast<int>(choices.size());
  for (const EnvChoice& c : choices) {
    if (i > 0) msg += i == n - 1 ? " or " : ", ";
    msg += fmt::format("{} ({}{})", c.value, i == 0 ? "the default: " : "", c.meaning);
    ++i;
  }
  return msg;
}

int env_choice(const char* name, std::initializer_list<EnvChoice> choices) {
  const char* v = std::getenv(name);
  const std::string_view s = v ? v : "";
  if (s.empty()) return 0;
  int i = 0;
  for (const EnvChoice& c : choices) {
    if (s == c.value) return i;
    ++i;
  }
  detail::throw_user_error(env_choice_error(name, std::string(s), choices));
}

}  // namespace strata
