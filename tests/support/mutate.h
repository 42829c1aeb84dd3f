#pragma once
// Hostile inputs for the file readers' tests: deterministic mutations of a valid file.
//
// Note [Hostile input tests]
// Every reader of a file a user hands Strata (configs, token shards, tokenizer files,
// safetensors, checkpoints, Hugging Face folders) must answer a malformed file with a UserError
// naming it, never a crash, a hang, an allocation the size of a made-up number or another kind of
// exception (docs/design.md decision 12). The hand-written tests name the errors one expects; these
// tests look for the ones nobody thought of: they take a valid file, apply a few random
// mutations drawn from a fixed seed (bit flips, bytes that matter to the format, numbers
// replaced by extreme ones, cut, repeated or deleted spans, a truncation), hand each mutant to
// the reader and accept two outcomes: the reader takes it, or it raises a UserError. Anything
// else fails the test with the mutant's seed, and the mutant is kept for a rerun
// (`STRATA_HOSTILE_KEEP=<dir>`). `STRATA_HOSTILE_ITERATIONS=N` changes the number of mutants per
// file (CI's default keeps each test to a few seconds; a sanitizer build with many more is how
// the readers were hardened: README, "Sanitizer builds").
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace strata::testing {

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}

  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }

  // One to four mutations of `s`.
  std::string mutate(std::string s) {
    const size_t n = 1 + below(4);
    for (size_t i = 0; i < n; ++i) mutate_once(s);
    return s;
  }

 private:
  void mutate_once(std::string& s) {
    static constexpr std::string_view kBytes[] = {
        "\0", "\xff", "\"", "[", "]", "{", "}", ",", ":", "-", "9", "\n", " ", "\\", ".", "e",
    };
    static constexpr std::string_view kNumbers[] = {
        "0",
        "-1",
        "1",
        "2147483647",
        "2147483648",
        "-2147483649",
        "4294967296",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "1e308",
        "-1e308",
        "1e-320",
        "65535",
        "65536",
        "1000000000",
        "99999999999999999999999999",
        "0.5",
        "4611686018427387904",
    };
    if (s.empty()) {
      s = std::string(kNumbers[below(std::size(kNumbers))]);
      return;
    }
    const size_t at = below(s.size());
    switch (below(8)) {
      case 0:  // flip a bit
        s[at] = static_cast<char>(s[at] ^ (1 << below(8)));
        break;
      case 1: {  // a byte that matters to text formats
        const std::string_view b = kBytes[below(std::size(kBytes))];
        s[at] = b.empty() ? '\0' : b[0];
        break;
      }
      case 2:
      case 3: {  // a run of digits (or the byte at `at`) becomes an extreme number
        size_t b = at;
        while (b > 0 && is_number_char(s[b - 1])) --b;
        size_t e = at;
        while (e < s.size() && is_number_char(s[e])) ++e;
        if (e == b) e = b + 1;
        s.replace(b, e - b, kNumbers[below(std::size(kNumbers))]);
        break;
      }
      case 4: {  // delete a span
        const size_t len = 1 + below(std::min<size_t>(64, s.size() - at));
        s.erase(at, len);
        break;
      }
      case 5: {  // repeat a span elsewhere
        const size_t len = 1 + below(std::min<size_t>(64, s.size() - at));
        const std::string span = s.substr(at, len);
        s.insert(below(s.size() + 1), span);
        break;
      }
      case 6:  // truncate
        s.resize(at);
        break;
      case 7: {  // an 8-byte little-endian word (a length, a count, an offset) set to an extreme
        static constexpr uint64_t kWords[] = {0,
                                              1,
                                              0xffffffffffffffffull,
                                              0x7fffffffffffffffull,
                                              0x8000000000000000ull,
                                              0xffffffffull,
                                              0x100000000ull,
                                              0x80000000ull};
        const uint64_t w = kWords[below(std::size(kWords))];
        const size_t width = below(2) == 0 ? 4 : 8;
        const size_t pos = (at / width) * width;
        for (size_t k = 0; k < width && pos + k < s.size(); ++k)
          s[pos + k] = static_cast<char>((w >> (8 * k)) & 0xff);
        break;
      }
    }
  }
  static bool is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+';
  }

  uint64_t state_;
};

inline int hostile_iterations(int default_count) {
  if (const char* v = std::getenv("STRATA_HOSTILE_ITERATIONS"); v && *v) return std::atoi(v);
  return default_count;
}

// What `check` saw over all mutants: how many it took and how many it refused.
struct HostileTally {
  int accepted = 0;
  int refused = 0;
};

// Writes `iterations` mutants of `good` to `path` in turn (`path`'s own contents are restored at
// the end) and runs `load` on each. A UserError is a refusal; `load` returning is an acceptance;
// anything else fails the test, naming the mutant's seed and keeping the mutant under
// $STRATA_HOSTILE_KEEP when set. `what` names the format in failures. `make`, when given, makes
// each mutant from its Mutator instead of `Mutator::mutate(good)` (to aim at part of a file).
inline HostileTally check_hostile(const std::string& what, const std::filesystem::path& path,
                                  const std::string& good, int iterations, uint64_t seed,
                                  const std::function<void()>& load,
                                  const std::function<std::string(Mutator&)>& make = nullptr) {
  HostileTally tally;
  auto write = [&](const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) ADD_FAILURE() << "cannot write " << path;
  };
  for (int i = 0; i < iterations; ++i) {
    const uint64_t s = seed * 1000003ull + static_cast<uint64_t>(i);
    Mutator m(s);
    const std::string bad = make ? make(m) : m.mutate(good);
    write(bad);
    std::string failure;
    try {
      load();
      ++tally.accepted;
    } catch (const UserError&) {
      ++tally.refused;
    } catch (const InternalError& e) {
      failure = std::string("InternalError: ") + e.what();
    } catch (const std::exception& e) {
      failure = std::string("a non-Strata exception: ") + e.what();
    } catch (...) {
      failure = "an unknown exception";
    }
    if (!failure.empty()) {
      std::string kept;
      if (const char* dir = std::getenv("STRATA_HOSTILE_KEEP"); dir && *dir) {
        kept = (std::filesystem::path(dir) / (what + "." + std::to_string(s))).string();
        std::ofstream(kept, std::ios::binary)
            .write(bad.data(), static_cast<std::streamsize>(bad.size()));
      }
      ADD_FAILURE() << what << " mutant seed " << s << " (" << bad.size() << " bytes) raised "
                    << failure
                    << (kept.empty() ? std::string(" (STRATA_HOSTILE_KEEP=<dir> keeps it)")
                                     : " (kept as " + kept + ")");
    }
  }
  write(good);
  return tally;
}

}  // namespace strata::testing
