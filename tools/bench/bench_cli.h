#pragma once
// The benchmarks' command line, on CLI11: how every bench_* parses argv and ends on a bad one.
//
// Note [Bench command line]
// Each benchmark declares its flags on a CLI::App named after it, bound to the variables that
// hold their defaults (--help shows them), and calls parse_args. --help prints the usage and the
// benchmark exits 0; an unknown flag, a flag without its value, a value that is not a number, a
// number below its minimum (counts and sizes: 1) or a word not among the choices prints
// "<bench>: <what is wrong>" and the hint to run --help on stderr, and the benchmark exits 1
// without measuring anything.
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace strata::bench {

// An integer flag's value of at least `min`.
inline CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        long long n = 0;
        if (!CLI::detail::lexical_cast(value, n) || n < min)
          return "must be an integer >= " + std::to_string(min) + ", got '" + value + "'";
        return {};
      },
      ">=" + std::to_string(min));
}

// Option `name` taking a value into `value`, whose value now is the default --help shows.
template <typename T>
CLI::Option* value_option(CLI::App& app, const std::string& name, T& value,
                          const std::string& help) {
  return app.add_option(name, value, help)->capture_default_str();
}

// The same for a count or size, at least 1.
template <typename T>
CLI::Option* count_option(CLI::App& app, const std::string& name, T& value,
                          const std::string& help) {
  return value_option(app, name, value, help)->check(at_least(1));
}

// Parses argv into `app`'s options (Note [Bench command line]). Returns the status to exit with
// when the benchmark must not run: 0 after --help, 1 after a bad argument; else nothing.
inline std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": " + CLI::FailureMessage::simple(a, e);
  });
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
}

}  // namespace strata::bench
