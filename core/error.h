#pragma once
// Errors and checks.
//
// Note [Two kinds of errors]
// A `UserError` is a mistake the user can fix (config, data, checkpoint, launch): its message says
// what is wrong and how to fix it, and tools print it and exit non-zero. An `InternalError` is a
// broken invariant inside Strata: the STRATA_CHECK macros raise it with the file and line, so a
// bug report can point at the code. Both derive from `Error` so callers can catch either.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public Error {
 public:
  using Error::Error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& msg);
[[noreturn]] void throw_user_error(const std::string& msg);
}  // namespace detail

// Raises a UserError with a formatted message.
template <typename... Args>
[[noreturn]] void user_error(fmt::format_string<Args...> f, Args&&... args) {
  detail::throw_user_error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace strata

// STRATA_CHECK(cond, "fmt {}", args...) — internal invariant; message is optional.
#define STRATA_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      ::strata::detail::throw_check_failure(__FILE__, __LINE__, #cond,                 \
                                            ::strata::detail::check_msg(__VA_ARGS__)); \
    }                                                                                  \
  } while (0)

// STRATA_USER_CHECK(cond, "fmt {}", args...) — user-facing precondition.
#define STRATA_USER_CHECK(cond, ...)                                                \
  do {                                                                              \
    if (!(cond)) [[unlikely]] {                                                     \
      ::strata::detail::throw_user_error(::strata::detail::check_msg(__VA_ARGS__)); \
    }                                                                               \
  } while (0)

#define STRATA_UNREACHABLE(...)                                            \
  ::strata::detail::throw_check_failure(__FILE__, __LINE__, "unreachable", \
                                        ::strata::detail::check_msg(__VA_ARGS__))

namespace strata::detail {
inline std::string check_msg() {
  return {};
}
template <typename... Args>
std::string check_msg(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}
}  // namespace strata::detail
