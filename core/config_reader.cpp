// The strict typed reader of core/config.h: conversions, unknown-key reports, suggestions
// (Note [Strict reading]).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>

#include "core/config.h"

namespace strata::config {

// ---------------------------------------------------------------------------------------------
// Suggestions

size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment distance over three rolling rows.
  const size_t n = a.size(), m = b.size();
  std::vector<size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

namespace {

// Whether `part` occurs in `whole` as whole words: at a start or after '_', and at the end or
// before '_'.
bool holds_words(std::string_view whole, std::string_view part) {
  for (size_t at = whole.find(part); at != std::string_view::npos; at = whole.find(part, at + 1)) {
    const size_t end = at + part.size();
    if ((at == 0 || whole[at - 1] == '_') && (end == whole.size() || whole[end] == '_'))
      return true;
  }
  return false;
}

}  // namespace

std::string nearest(std::string_view word, const std::vector<std::string>& candidates) {
  auto lower = [](std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string w = lower(word);
  std::string best;
  size_t best_score = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const std::string c = lower(candidate);
    const size_t d = edit_distance(w, c);
    // A typo changes about one character in three; a shortened or lengthened name
    // ("warmup" for "warmup_steps") holds the other as whole '_'-separated words ("eps" inside
    // "grad_accum_steps" is no such name).
    const size_t limit = std::max<size_t>(1, std::max(w.size(), c.size()) / 3);
    const bool contains =
        std::min(w.size(), c.size()) >= 3 && (holds_words(c, w) || holds_words(w, c));
    if ((d <= limit || contains) && d < best_score) {
      best = candidate;
      best_score = d;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Typed conversions

namespace detail {
void type_error(const Node& node, const std::string& what, std::string_view expected) {
  std::string got =
      node.is_scalar() ? fmt::format("'{}'", node.value()) : std::string(node.kind_name());
  user_error("{}: {}: expected {}, got {}", node.source().str(), what, expected, got);
}
}  // namespace detail

namespace {

template <typename T>
void convert_integer(const Node& node, const std::string& what, T& out, std::string_view expected) {
  if (!node.is_scalar()) detail::type_error(node, what, expected);
  const std::string& s = node.value();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  T value{};
  auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
  if (ec == std::errc::result_out_of_range)
    user_error("{}: {}: {} is out of range for {}", node.source().str(), what, s, expected);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty())
    detail::type_error(node, what, expected);
  out = value;
}

}  // namespace

void convert(const Node& node, const std::string& what, bool& out) {
  if (node.is_scalar()) {
    std::string s = node.value();
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "yes" || s == "on") {
      out = true;
      return;
    }
    if (s == "false" || s == "no" || s == "off") {
      out = false;
      return;
    }
  }
  detail::type_error(node, what, "true or false");
}

void convert(const Node& node, const std::string& what, int& out) {
  convert_integer(node, what, out, "an integer");
}

void convert(const Node& node, const std::string& what, int64_t& out) {
  convert_integer(node, what, out, "an integer");
}

void convert(const Node& node, const std::string& what, uint64_t& out) {
  convert_integer(node, what, out, "a non-negative integer");
}

void convert(const Node& node, const std::string& what, double& out) {
  if (!node.is_scalar()) detail::type_error(node, what, "a number");
  const std::string& s = node.value();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  double value = 0;
  auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || !std::isfinite(value))
    detail::type_error(node, what, "a number");
  out = value;
}

void convert(const Node& node, const std::string& what, std::string& out) {
  if (node.is_null()) {
    out.clear();
    return;
  }
  if (!node.is_scalar()) detail::type_error(node, what, "a string");
  out = node.value();
}

void convert(const Node& node, const std::string& what, std::map<std::string, std::string>& out) {
  if (node.is_null()) {
    out.clear();
    return;
  }
  if (!node.is_map()) detail::type_error(node, what, "a map of key: value");
  std::map<std::string, std::string> result;
  for (size_t i = 0; i < node.size(); ++i) {
    if (!node.item(i).is_scalar())
      detail::type_error(node.item(i), what + "." + node.key(i), "a single value");
    result[node.key(i)] = node.item(i).value();
  }
  out = std::move(result);
}

// ---------------------------------------------------------------------------------------------
// Reader

struct Reader::State {
  const Node* node = nullptr;  // a map, or nullptr for an empty section
  std::string path;
  std::string file;
  std::vector<std::string> valid;
  std::vector<bool> used;
  std::vector<std::shared_ptr<State>> children;
};

Reader::Reader(const Node& node, std::string path, std::string file)
    : state_(std::make_shared<State>()) {
  if (!node.is_map() && !node.is_null())
    user_error("{}: {}: expected a section (a map of keys), got {}", node.source().str(),
               path.empty() ? std::string("the top level") : path, node.kind_name());
  state_->node = node.is_map() ? &node : nullptr;
  state_->path = std::move(path);
  state_->file = std::move(file);
  state_->used.assign(node.size(), false);
}

std::string Reader::key_path(std::string_view key) const {
  return state_->path.empty() ? std::string(key) : fmt::format("{}.{}", state_->path, key);
}

Source Reader::source_of(std::string_view key) const {
  const Node* node = state_->node ? state_->node->find(key) : nullptr;
  return node ? node->source() : Source{state_->file, 0, 0};
}

const Node* Reader::take(std::string_view key) {
  State& s = *state_;
  if (std::find(s.valid.begin(), s.valid.end(), key) == s.valid.end()) s.valid.emplace_back(key);
  if (s.node == nullptr) return nullptr;
  for (size_t i = 0; i < s.node->size(); ++i)
    if (s.node->key(i) == key) {
      s.used[i] = true;
      return &s.node->item(i);
    }
  return nullptr;
}

const Node* Reader::raw(std::string_view key) {
  return take(key);
}

bool Reader::get_enum(std::string_view key, std::string& out,
                      const std::vector<std::string>& allowed) {
  std::string value;
  if (!get(key, value)) return false;
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    const std::string near = nearest(value, allowed);
    fail(key, fmt::format("expected one of {}, got '{}'{}", list, value,
                          near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
  }
  out = value;
  return true;
}

Reader Reader::section(std::string_view key) {
  static const Node kEmpty;
  const Node* node = take(key);
  if (node != nullptr && !node->is_map() && !node->is_null())
    fail(key, fmt::format("expected a section (a map of keys), got {}",
                          node->is_scalar() ? fmt::format("'{}'", node->value())
                                            : std::string(node->kind_name())));
  Reader child(node ? *node : kEmpty, key_path(key), state_->file);
  state_->children.push_back(child.state_);
  return child;
}

void Reader::fail(std::string_view key, const std::string& message) const {
  user_error("{}: {}: {}", source_of(key).str(), key_path(key), message);
}

void Reader::positive(std::string_view key, double value) {
  if (!(value > 0)) fail(key, fmt::format("must be positive, got {}", value));
}

void Reader::non_negative(std::string_view key, double value) {
  if (!(value >= 0)) fail(key, fmt::format("must be >= 0, got {}", value));
}

void Reader::in_range(std::string_view key, double value, double lo, double hi, bool hi_inclusive) {
  const bool ok = value >= lo && (hi_inclusive ? value <= hi : value < hi);
  if (!ok)
    fail(key, fmt::format("must be in [{}, {}{}, got {}", lo, hi, hi_inclusive ? "]" : ")", value));
}

void Reader::collect_unknown(std::vector<std::string>& errors) const {
  const State& s = *state_;
  for (size_t i = 0; s.node != nullptr && i < s.node->size(); ++i) {
    if (s.used[i]) continue;
    const std::string& key = s.node->key(i);
    std::string msg =
        fmt::format("{}: unknown key '{}' in section '{}'", s.node->key_source(i).str(), key,
                    s.path.empty() ? "root" : s.path);
    const std::string near = nearest(key, s.valid);
    if (!near.empty()) {
      msg += fmt::format("; did you mean '{}'?", near);
    } else {
      std::string list;
      for (const std::string& v : s.valid) list += (list.empty() ? "" : ", ") + v;
      msg += fmt::format("; valid keys: {}", list);
    }
    errors.push_back(std::move(msg));
  }
  for (const auto& child : s.children) Reader(child).collect_unknown(errors);
}

void Reader::finish() const {
  std::vector<std::string> errors;
  collect_unknown(errors);
  if (errors.empty()) return;
  std::string text;
  for (const std::string& e : errors) text += (text.empty() ? "" : "\n") + e;
  user_error("{}", text);
}

}  // namespace strata::config
