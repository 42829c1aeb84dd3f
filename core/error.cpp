#include "core/error.h"

namespace strata::detail {

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  std::string text = fmt::format("internal check failed at {}:{}: `{}`", file, line, cond);
  if (!msg.empty()) text += ": " + msg;
  throw InternalError(text);
}

void throw_user_error(const std::string& msg) {
  throw UserError(msg);
}

}  // namespace strata::detail
