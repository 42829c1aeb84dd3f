#include "core/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::config {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Source and Node

std::string Source::str() const {
  if (line <= 0) return file;
  if (column <= 0) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{}:{}", file, line, column);
}

Node Node::null(Source source) {
  Node n;
  n.source_ = std::move(source);
  return n;
}

Node Node::scalar(std::string value, Source source) {
  Node n;
  n.kind_ = Kind::Scalar;
  n.value_ = std::move(value);
  n.source_ = std::move(source);
  return n;
}

Node Node::map(Source source) {
  Node n;
  n.kind_ = Kind::Map;
  n.source_ = std::move(source);
  return n;
}

Node Node::sequence(Source source) {
  Node n;
  n.kind_ = Kind::Sequence;
  n.source_ = std::move(source);
  return n;
}

std::string_view Node::kind_name() const {
  switch (kind_) {
    case Kind::Null:
      return "null";
    case Kind::Scalar:
      return "a scalar";
    case Kind::Map:
      return "a map";
    case Kind::Sequence:
      return "a list";
  }
  return "?";
}

const std::string& Node::value() const {
  STRATA_CHECK(kind_ == Kind::Scalar, "value() of {}", kind_name());
  return value_;
}

const Node* Node::find(std::string_view key) const {
  if (kind_ != Kind::Map) return nullptr;
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return &items_[i];
  return nullptr;
}

Node* Node::find(std::string_view key) {
  return const_cast<Node*>(static_cast<const Node*>(this)->find(key));
}

Node& Node::set(std::string key, Source key_source, Node value) {
  STRATA_CHECK(kind_ == Kind::Map, "set() on {}", kind_name());
  if (Node* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  keys_.push_back(std::move(key));
  key_sources_.push_back(std::move(key_source));
  items_.push_back(std::move(value));
  return items_.back();
}

bool Node::erase(std::string_view key) {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) {
      keys_.erase(keys_.begin() + i);
      key_sources_.erase(key_sources_.begin() + i);
      items_.erase(items_.begin() + i);
      return true;
    }
  return false;
}

void Node::push_back(Node value) {
  STRATA_CHECK(kind_ == Kind::Sequence, "push_back() on {}", kind_name());
  items_.push_back(std::move(value));
}

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

Source mark_source(const YAML::Mark& mark, const std::string& file) {
  // yaml-cpp marks are 0-based, and -1 when unknown.
  return Source{file, mark.line >= 0 ? mark.line + 1 : 0, mark.column >= 0 ? mark.column + 1 : 0};
}

Node from_yaml(const YAML::Node& y, const std::string& file) {
  Source source = mark_source(y.Mark(), file);
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return Node::null(source);
    case YAML::NodeType::Scalar:
      return Node::scalar(y.Scalar(), source);
    case YAML::NodeType::Sequence: {
      Node seq = Node::sequence(source);
      for (const YAML::Node& item : y) seq.push_back(from_yaml(item, file));
      return seq;
    }
    case YAML::NodeType::Map: {
      Node map = Node::map(source);
      for (auto it = y.begin(); it != y.end(); ++it) {
        Source key_source = mark_source(it->first.Mark(), file);
        if (!it->first.IsScalar())
          user_error("{}: map keys must be plain names, got a {}", key_source.str(),
                     it->first.IsMap() ? "map" : "list or null");
        const std::string key = it->first.Scalar();
        if (map.find(key) != nullptr) {
          size_t first = 0;
          while (map.key(first) != key) ++first;
          user_error("{}: duplicate key '{}' (first given at line {}); keep only one",
                     key_source.str(), key, map.key_source(first).line);
        }
        map.set(key, key_source, from_yaml(it->second, file));
      }
      return map;
    }
  }
  STRATA_UNREACHABLE("yaml node type");
}

// Sources of a value given on the command line: no line, no column.
void strip_lines(Node& node) {
  node = [&] {
    Source s{"--set", 0, 0};
    switch (node.kind()) {
      case Node::Kind::Null:
        return Node::null(s);
      case Node::Kind::Scalar:
        return Node::scalar(node.value(), s);
      case Node::Kind::Sequence: {
        Node out = Node::sequence(s);
        for (size_t i = 0; i < node.size(); ++i) {
          Node item = node.item(i);
          strip_lines(item);
          out.push_back(std::move(item));
        }
        return out;
      }
      case Node::Kind::Map: {
        Node out = Node::map(s);
        for (size_t i = 0; i < node.size(); ++i) {
          Node item = node.item(i);
          strip_lines(item);
          out.set(node.key(i), s, std::move(item));
        }
        return out;
      }
    }
    STRATA_UNREACHABLE("node kind");
  }();
}

std::string read_text(const std::string& path, const Source* included_from) {
  const std::string where =
      included_from ? fmt::format("{}: base: ", included_from->str()) : std::string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    user_error("{}config file '{}' not found (relative paths are taken from {})", where, path,
               included_from ? "the including file's folder" : "the working directory");
  if (fs::is_directory(path, ec))
    user_error("{}config path '{}' is a directory; give a .yaml file", where, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("{}cannot read config file '{}'", where, path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Node load_recursive(const std::string& path, std::vector<std::string>& chain,
                    std::vector<std::string>& chain_names, const Source* included_from) {
  const std::string text = read_text(path, included_from);
  std::error_code ec;
  std::string canonical = fs::weakly_canonical(path, ec).string();
  if (ec) canonical = fs::absolute(path).lexically_normal().string();
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    std::string names;
    for (const std::string& n : chain_names) names += n + " -> ";
    user_error("{}: base: inheritance cycle {}{}; remove one of these base: entries",
               included_from->str(), names, path);
  }
  Node node = parse_string(text, path);
  if (!node.is_map())
    user_error("{}: the top level of a config must be a map of sections (e.g. `run:`), got {}",
               path, node.is_null() ? std::string("an empty document") : node.kind_name());

  const Node* base = node.find("base");
  if (base == nullptr) return node;
  std::vector<const Node*> entries;
  if (base->is_scalar()) {
    entries.push_back(base);
  } else if (base->is_sequence()) {
    for (size_t i = 0; i < base->size(); ++i) entries.push_back(&base->item(i));
  } else {
    user_error("{}: base: expected a file path or a list of file paths, got {}",
               base->source().str(), base->kind_name());
  }

  chain.push_back(canonical);
  chain_names.push_back(path);
  Node merged = Node::map(node.source());
  for (const Node* entry : entries) {
    if (!entry->is_scalar() || entry->value().empty())
      user_error("{}: base: expected a file path, got {}", entry->source().str(),
                 entry->is_scalar() ? std::string("an empty string") : entry->kind_name());
    fs::path target = entry->value();
    if (target.is_relative()) target = fs::path(path).parent_path() / target;
    merge(merged,
          load_recursive(target.lexically_normal().string(), chain, chain_names, &entry->source()));
  }
  chain.pop_back();
  chain_names.pop_back();
  node.erase("base");
  merge(merged, node);
  return merged;
}

}  // namespace

Node parse_string(const std::string& text, const std::string& file) {
  YAML::Node y;
  try {
    y = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    user_error("{}: invalid YAML: {}", mark_source(e.mark, file).str(), e.msg);
  }
  return from_yaml(y, file);
}

Node load_file(const std::string& path) {
  std::vector<std::string> chain, chain_names;
  return load_recursive(path, chain, chain_names, nullptr);
}

void merge(Node& base, const Node& overlay) {
  if (!base.is_map() || !overlay.is_map()) {
    base = overlay;
    return;
  }
  for (size_t i = 0; i < overlay.size(); ++i) {
    Node* existing = base.find(overlay.key(i));
    if (existing != nullptr && existing->is_map() && overlay.item(i).is_map())
      merge(*existing, overlay.item(i));
    else
      base.set(overlay.key(i), overlay.key_source(i), overlay.item(i));
  }
}

void apply_set(Node& root, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  const std::string_view path = eq == std::string_view::npos ? "" : trim(assignment.substr(0, eq));
  std::vector<std::string> parts;
  bool ok = !path.empty();
  for (size_t start = 0; ok && start <= path.size();) {
    size_t dot = path.find('.', start);
    if (dot == std::string_view::npos) dot = path.size();
    parts.emplace_back(path.substr(start, dot - start));
    ok = !parts.back().empty();
    start = dot + 1;
  }
  if (!ok)
    user_error(
        "--set '{}': --set a.b=c expects key=value, with a dotted key such as "
        "optimizer.lr=3e-4",
        assignment);

  YAML::Node parsed;
  try {
    parsed = YAML::Load(std::string(assignment.substr(eq + 1)));
  } catch (const YAML::Exception& e) {
    user_error(
        "--set '{}': the value is not valid YAML ({} at column {}); quote it if it is a "
        "string",
        assignment, e.msg, e.mark.column + 1);
  }
  Node value = from_yaml(parsed, "--set");
  strip_lines(value);

  const Source set_source{"--set", 0, 0};
  if (!root.is_map()) root = Node::map(set_source);
  Node* cursor = &root;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    Node* next = cursor->find(parts[i]);
    if (next == nullptr || next->is_null()) {
      next = &cursor->set(parts[i], set_source, Node::map(set_source));
    } else if (!next->is_map()) {
      user_error("--set '{}': '{}' ({}) is {}, not a section, so it has no key '{}'", assignment,
                 walked, next->source().str(), next->kind_name(), parts[i + 1]);
    }
    cursor = next;
  }
  cursor->set(parts.back(), set_source, std::move(value));
}

// ---------------------------------------------------------------------------------------------
// Emitting

namespace {

bool needs_quotes(const std::string& s) {
  // yaml-cpp emits these plain, and they would read back as null (or be lost entirely).
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

void emit(YAML::Emitter& out, const Node& node) {
  switch (node.kind()) {
    case Node::Kind::Null:
      out << YAML::Null;
      break;
    case Node::Kind::Scalar:
      if (needs_quotes(node.value())) out << YAML::DoubleQuoted;
      out << node.value();
      break;
    case Node::Kind::Sequence: {
      bool flat = true;
      for (size_t i = 0; i < node.size(); ++i)
        flat = flat && !node.item(i).is_map() && !node.item(i).is_sequence();
      // Say Block explicitly: yaml-cpp 0.7 lets Flow leak from an empty flow list to the next
      // collection.
      out << (flat || node.size() == 0 ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
      for (size_t i = 0; i < node.size(); ++i) emit(out, node.item(i));
      out << YAML::EndSeq;
      break;
    }
    case Node::Kind::Map:
      out << (node.size() == 0 ? YAML::Flow : YAML::Block) << YAML::BeginMap;
      for (size_t i = 0; i < node.size(); ++i) {
        out << YAML::Key << node.key(i) << YAML::Value;
        const Node& item = node.item(i);
        emit(out, item);
        if (!item.comment().empty()) out << YAML::Comment(item.comment());
      }
      out << YAML::EndMap;
      break;
  }
}

}  // namespace

std::string to_yaml(const Node& node) {
  YAML::Emitter out;
  out.SetIndent(2);
  emit(out, node);
  STRATA_CHECK(out.good(), "yaml emitter: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace strata::config
