#pragma once
// Strict YAML configs: a source-located tree, `base:` inheritance, `--set` overrides, and a typed
// reader that rejects unknown keys and wrong types (docs/design.md decision 11).
//
// Note [Config sources]
// Every node remembers where it was written (file, 1-based line and column; `--set` for a
// command-line override, which has no line). Merging keeps the source of the winning node, so an
// error about a key inherited from a base file points into that base file. Errors therefore read
// "configs/x.yaml:7:9: optimizer.lr: expected a number, got 'fast'".
//
// Note [Config inheritance]
// A top-level `base:` (a path, or a list of paths, relative to the including file's directory)
// names files loaded first, recursively; they are merged in order and the including file is
// merged last. Merging is deep for maps (the later file wins key by key, and the keys keep the
// order in which they first appeared) and replaces everything else whole: a sequence in a child
// replaces the base's sequence, it is never appended to. `base:` is consumed by load_file and
// never reaches the typed reader. A file that (indirectly) includes itself is an error naming
// the chain.
//
// Note [Strict reading]
// A Reader hands out a map's values one key at a time; every key asked for (present or not)
// becomes a valid key of that section. finish() then reports each key present in the file that
// nobody asked for, with the nearest valid key by edit distance when one is close. Scalars stay
// strings in the tree; their type is decided only when a Reader converts them, so the same tree
// serves any schema.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace strata::config {

// Note [Config sources].
struct Source {
  std::string file;  // the YAML path, or "--set"
  int line = 0;      // 1-based; 0 when there is none (command line, defaults)
  int column = 0;    // 1-based; 0 when there is none

  // "file:line:column", "file:line" or "file".
  std::string str() const;
};

class Node {
 public:
  enum class Kind : uint8_t { Null, Scalar, Map, Sequence };

  Node() = default;  // null without a source
  static Node null(Source source);
  static Node scalar(std::string value, Source source);
  static Node map(Source source);
  static Node sequence(Source source);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_scalar() const { return kind_ == Kind::Scalar; }
  bool is_map() const { return kind_ == Kind::Map; }
  bool is_sequence() const { return kind_ == Kind::Sequence; }
  const Source& source() const { return source_; }
  // "null", "a scalar", "a map", "a list": for error messages.
  std::string_view kind_name() const;

  // Scalar text (internal error on other kinds).
  const std::string& value() const;

  // Map entries in insertion order, and sequence items; size() is 0 for scalars and null.
  size_t size() const { return items_.size(); }
  const Node& item(size_t i) const { return items_.at(i); }
  Node& item(size_t i) { return items_.at(i); }
  const std::string& key(size_t i) const { return keys_.at(i); }           // maps only
  const Source& key_source(size_t i) const { return key_sources_.at(i); }  // maps only

  // Map lookup; nullptr when absent (or when this is not a map).
  const Node* find(std::string_view key) const;
  Node* find(std::string_view key);
  // Map insert or replace (a replaced key keeps its position); returns the stored node.
  Node& set(std::string key, Source key_source, Node value);
  bool erase(std::string_view key);
  void push_back(Node value);  // sequences only

  // Optional note that to_yaml writes as a trailing comment (e.g. a derived value).
  const std::string& comment() const { return comment_; }
  void set_comment(std::string comment) { comment_ = std::move(comment); }

 private:
  Kind kind_ = Kind::Null;
  std::string value_;
  Source source_;
  std::vector<std::string> keys_;    // maps: parallel to items_
  std::vector<Source> key_sources_;  // maps: parallel to items_
  std::vector<Node> items_;
  std::string comment_;
};

// Parses one YAML text into a Node whose sources name `file` (no `base:` handling).
// strata::user_error naming the file, line and column on a syntax error or a duplicate key.
Node parse_string(const std::string& text, const std::string& file);

// Loads a config file and resolves `base:` (Note [Config inheritance]). strata::user_error naming
// the file on a missing or unreadable file, a syntax error, a top level that is not a map, a bad
// `base:` value, or an inheritance cycle.
Node load_file(const std::string& path);

// Deep-merges `overlay` into `base` (Note [Config inheritance]).
void merge(Node& base, const Node& overlay);

// Applies one command-line override "a.b.c=value". The value is parsed as YAML, so
// "optimizer.betas=[0.9,0.99]" sets a list; missing intermediate maps are created.
// strata::user_error on a malformed assignment or when a path component is not a map.
void apply_set(Node& root, std::string_view assignment);

// Block-style YAML for a tree (flow style for lists of scalars); parsing it back gives the same
// tree, less sources and comments.
std::string to_yaml(const Node& node);

// Edit distance (insertions, deletions, substitutions and adjacent transpositions, all cost 1).
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to `word` when it is close enough to be a plausible typo, else "".
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

// Note [Strict reading].
class Reader {
 public:
  // `node` must be a map, or null (an empty section); `path` is the dotted section name ("" for
  // the top level) and `file` names the file for errors about keys that are absent.
  // The node must outlive the reader.
  Reader(const Node& node, std::string path, std::string file);

  // Optional key: leaves `out` alone and returns false when absent. Supported T: bool, int,
  // int64_t, uint64_t, double, std::string (null reads as ""), std::vector of those, and
  // std::map<std::string, std::string> (a map of scalars; null reads as empty). Null for any
  // other type is a type error: `lr:` with nothing after it is a mistake, not a default.
  template <typename T>
  bool get(std::string_view key, T& out);
  // Required key: strata::user_error "file: missing required key 'data.train'" when absent.
  template <typename T>
  void require(std::string_view key, T& out);
  // A string that must be one of `allowed`; the error lists them (and the nearest one).
  bool get_enum(std::string_view key, std::string& out, const std::vector<std::string>& allowed);
  // A nested section; an absent key gives an empty section. Its unknown keys are reported by
  // the finish() of this reader too.
  Reader section(std::string_view key);
  // The raw node of a key (nullptr when absent), marked as consumed.
  const Node* raw(std::string_view key);

  // Range checks on a value already read; the error points at the key (or names the file when
  // the value is a default) and gives the value.
  void positive(std::string_view key, double value);
  void non_negative(std::string_view key, double value);
  // lo <= value < hi (hi_inclusive: value <= hi).
  void in_range(std::string_view key, double value, double lo, double hi,
                bool hi_inclusive = false);
  // Raises "location: path.key: message".
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;

  // "optimizer.lr" for key "lr" of section "optimizer".
  std::string key_path(std::string_view key) const;
  // Where a key was written; the file alone when it is absent.
  Source source_of(std::string_view key) const;

  // strata::user_error listing every key present in this section or its sub-sections that no
  // get/require/section/raw asked for, each with its location and a suggestion.
  void finish() const;

 private:
  struct State;
  explicit Reader(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const Node* take(std::string_view key);  // registers the key as valid, marks it consumed
  void collect_unknown(std::vector<std::string>& errors) const;

  std::shared_ptr<State> state_;
};

// Typed conversions used by Reader::get; `what` is the dotted key for error messages.
void convert(const Node& node, const std::string& what, bool& out);
void convert(const Node& node, const std::string& what, int& out);
void convert(const Node& node, const std::string& what, int64_t& out);
void convert(const Node& node, const std::string& what, uint64_t& out);
void convert(const Node& node, const std::string& what, double& out);
void convert(const Node& node, const std::string& what, std::string& out);
void convert(const Node& node, const std::string& what, std::map<std::string, std::string>& out);
template <typename T>
void convert(const Node& node, const std::string& what, std::vector<T>& out);

namespace detail {
[[noreturn]] void type_error(const Node& node, const std::string& what, std::string_view expected);
}  // namespace detail

template <typename T>
void convert(const Node& node, const std::string& what, std::vector<T>& out) {
  if (!node.is_sequence()) detail::type_error(node, what, "a list");
  std::vector<T> result(node.size());
  for (size_t i = 0; i < node.size(); ++i)
    convert(node.item(i), what + "[" + std::to_string(i) + "]", result[i]);
  out = std::move(result);
}

template <typename T>
bool Reader::get(std::string_view key, T& out) {
  const Node* node = take(key);
  if (node == nullptr) return false;
  convert(*node, key_path(key), out);
  return true;
}

template <typename T>
void Reader::require(std::string_view key, T& out) {
  if (!get(key, out))
    user_error("{}: missing required key '{}'", source_of(key).str(), key_path(key));
}

}  // namespace strata::config
