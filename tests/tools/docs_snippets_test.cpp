// The configs the documentation shows are configs `train` accepts: every file of configs/, every
// ```yaml block and every `train` command line of README.md and docs/ (Note [Docs snippets]).
//
// Note [Docs snippets]
// What is checked, each with `train ... --print-config` (which parses, validates and resolves
// the whole config, and reads no data):
//   - every file of configs/, as it is;
//   - every fenced ```yaml block of README.md and of each .md file under docs/. A block is a
//     config on its own or a fragment of one. It is written to a scratch directory that links
//     every file of configs/ (so `base: gpt2-common.yaml` resolves as it would for a file in
//     configs/, and `base: configs/x.yaml` as from the repository root); a block without a
//     top-level `base:` gets `base: snippet_base.yaml` appended, a config that sets only what
//     the defaults lack: `data.train` (required) and `batch.seq_len: 64` (the default, 128, is
//     longer than the default model gpt2-tiny's context). Appending keeps the block's line
//     numbers, so train's "file:line:column" is turned into the doc's own line;
//   - every line of a ```sh or ```bash block that runs `.../bin/train` (continuation lines
//     joined): its --config/-c and --set arguments, run from the repository root;
//   - every option (--flag) given to train, generate, convert, tokenize or estimate in a shell
//     block (`.../bin/<tool>`) or in an inline `code` span of the prose that starts with the
//     tool's name: the tool's --help must list it.
// A block that is deliberately not a config (a partial example, a wrong one shown as such)
// starts with the line `# not-a-config: <why>`; a command line that must not run carries
// `# not-a-config: <why>` as its comment. Keep such marks rare: an unmarked block is a promise
// that it loads.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <regex>

#include "tests/support/tool_test_util.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::ScratchDir;

const std::string kTrain = std::string(STRATA_BINARY_DIR) + "/train";
const fs::path kSource = STRATA_SOURCE_DIR;
constexpr const char* kSkipMark = "# not-a-config";

struct Block {
  std::string doc;  // relative to the repository root
  int line = 0;     // 1-based line of the opening fence
  std::string lang;
  std::vector<std::string> lines;  // without the fence's indentation
};

std::string ltrim(const std::string& s) {
  return s.substr(std::min(s.size(), s.find_first_not_of(' ')));
}

std::string rtrim(const std::string& s) {
  const size_t end = s.find_last_not_of(" \t\r");
  return end == std::string::npos ? std::string() : s.substr(0, end + 1);
}

// The fenced blocks of the Markdown file `path`, named `doc` in messages (``` fences, possibly
// indented inside list items).
std::vector<Block> fenced_blocks(const fs::path& path, const std::string& doc) {
  std::vector<Block> out;
  std::istringstream in(testing::read_text(path.string()));
  std::string line;
  std::optional<Block> open;
  size_t indent = 0;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string body = ltrim(line);
    if (body.rfind("```", 0) == 0) {
      if (open) {
        out.push_back(std::move(*open));
        open.reset();
      } else {
        open = Block{doc, n, rtrim(body.substr(3)), {}};
        indent = line.size() - body.size();
      }
      continue;
    }
    if (open) {
      const size_t lead = line.size() - ltrim(line).size();
      open->lines.push_back(line.substr(std::min(lead, indent)));
    }
  }
  EXPECT_FALSE(open) << doc << ":" << (open ? open->line : 0) << ": a ``` fence is never closed";
  return out;
}

// README.md and every .md file under docs/, sorted.
std::vector<std::string> doc_files() {
  std::vector<std::string> out = {"README.md"};
  for (const auto& e : fs::recursive_directory_iterator(kSource / "docs"))
    if (e.is_regular_file() && e.path().extension() == ".md")
      out.push_back(fs::relative(e.path(), kSource).string());
  std::sort(out.begin() + 1, out.end());
  return out;
}

std::vector<Block> yaml_blocks() {
  std::vector<Block> out;
  for (const std::string& doc : doc_files())
    for (Block& b : fenced_blocks(kSource / doc, doc))
      if (b.lang == "yaml") out.push_back(std::move(b));
  return out;
}

bool skipped(const Block& b) {
  return !b.lines.empty() && b.lines.front().rfind(kSkipMark, 0) == 0;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// Runs train with `args` and --print-config; an error message when it refuses, else nullopt.
std::optional<std::string> print_config_error(std::vector<std::string> args,
                                              const std::string& cwd) {
  args.insert(args.begin(), kTrain);
  args.push_back("--print-config");
  const CommandResult r = testing::run_command(args, std::chrono::seconds(60), cwd);
  if (r.exit_code == 0) return std::nullopt;
  return fmt::format("train exited with status {}: {}", r.exit_code, rtrim(r.err));
}

// A scratch directory holding links to every file of configs/ and a `configs` link, so a block's
// `base:` resolves from there as from configs/ or from the repository root.
class SnippetDir {
 public:
  SnippetDir() {
    for (const auto& e : fs::directory_iterator(kSource / "configs"))
      fs::create_symlink(e.path(), fs::path(dir_.path()) / e.path().filename());
    fs::create_symlink(kSource / "configs", fs::path(dir_ / "configs"));
    testing::write_text(dir_ / "snippet_base.yaml",
                        "data:\n  train: datasets/fortunes/train_*.bin\nbatch:\n  seq_len: 64\n");
  }

  // nullopt when `train --print-config` takes the block (Note [Docs snippets]); else the error,
  // naming the doc and the line, with train's message pointing into the doc.
  std::optional<std::string> check(const Block& b) const {
    std::string text = join(b.lines);
    const std::regex has_base("(^|\n)base:");
    if (!std::regex_search(text, has_base)) text += "base: snippet_base.yaml\n";
    const std::string file = dir_ / "snippet.yaml";
    testing::write_text(file, text);
    std::optional<std::string> error = print_config_error({"--config", file}, dir_.path());
    if (!error) return std::nullopt;
    // "<file>:L:C" is line L of the block, line b.line + L of the doc.
    const std::regex at(std::regex_replace(file, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                        R"((:(\d+))?)");
    std::string msg;
    std::smatch m;
    std::string rest = *error;
    while (std::regex_search(rest, m, at)) {
      msg += m.prefix().str() + (m[2].matched
                                     ? fmt::format("{}:{}", b.doc, b.line + std::stoi(m[2].str()))
                                     : fmt::format("{} (the block at line {})", b.doc, b.line));
      rest = m.suffix().str();
    }
    msg += rest;
    return fmt::format(
        "{}:{}: the ```yaml block is not a config train accepts (mark it '{}: "
        "<why>' if it is not meant to be one)\n  {}",
        b.doc, b.line, kSkipMark, msg);
  }

 private:
  ScratchDir dir_;
};

// A `train` command line of a shell block: where it is and its --config/--set arguments.
struct Command {
  std::string doc;
  int line = 0;
  std::string text;
  std::vector<std::string> args;
};

std::vector<Command> train_commands(const std::vector<Block>& blocks) {
  std::vector<Command> out;
  for (const Block& b : blocks) {
    if (b.lang != "sh" && b.lang != "bash") continue;
    for (size_t i = 0; i < b.lines.size(); ++i) {
      const int line = b.line + 1 + static_cast<int>(i);
      std::string text = b.lines[i];
      while (!rtrim(text).empty() && rtrim(text).back() == '\\' && i + 1 < b.lines.size())
        text = rtrim(text).substr(0, rtrim(text).size() - 1) + " " + b.lines[++i];
      if (text.find(kSkipMark) != std::string::npos) continue;
      if (const size_t hash = text.find(" #"); hash != std::string::npos) text.resize(hash);
      std::istringstream words(text);
      std::vector<std::string> tokens;
      for (std::string w; words >> w;) tokens.push_back(w);
      auto train = std::find_if(tokens.begin(), tokens.end(), [](const std::string& t) {
        return t.size() >= 9 && t.compare(t.size() - 9, 9, "bin/train") == 0;
      });
      if (train == tokens.end()) continue;
      Command c{b.doc, line, rtrim(text), {}};
      for (auto t = train + 1; t != tokens.end(); ++t) {
        if (*t == "|" || *t == "&&" || *t == ";" || *t == "||") break;
        if ((*t == "--config" || *t == "-c" || *t == "--set") && t + 1 != tokens.end()) {
          c.args.push_back(*t);
          c.args.push_back(*++t);
        }
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<Command> train_commands() {
  std::vector<Block> blocks;
  for (const std::string& doc : doc_files())
    for (Block& b : fenced_blocks(kSource / doc, doc)) blocks.push_back(std::move(b));
  return train_commands(blocks);
}

std::optional<std::string> check(const Command& c) {
  std::optional<std::string> error = print_config_error(c.args, kSource.string());
  if (!error) return std::nullopt;
  return fmt::format(
      "{}:{}: `{}` does not load (mark the line '{}: <why>' if it is not meant "
      "to)\n  {}",
      c.doc, c.line, c.text, kSkipMark, *error);
}

// A tool's command line as a doc shows it: in a shell block, or in an inline `code` span of the
// prose that starts with the tool (Note [Docs snippets]).
struct ToolUse {
  std::string doc;
  int line = 0;
  std::string tool;                // train, generate, convert, tokenize or estimate
  std::vector<std::string> flags;  // the --flags given to it
};

const std::vector<std::string> kTools = {"train", "generate", "convert", "tokenize", "estimate"};

// The tool `token` runs ("build/bin/generate" or, in prose, "generate"), or "".
std::string tool_of(const std::string& token, bool bare_allowed) {
  for (const std::string& t : kTools) {
    if (bare_allowed && token == t) return t;
    const std::string path = "bin/" + t;
    if (token.size() >= path.size() &&
        token.compare(token.size() - path.size(), path.size(), path) == 0)
      return t;
  }
  return "";
}

// The uses of a tool in `words` (one command line), from its token to the end of its command.
void collect_uses(const std::string& doc, int line, const std::vector<std::string>& words,
                  bool bare_allowed, std::vector<ToolUse>& out) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string tool = tool_of(words[i], bare_allowed && i == 0);
    if (tool.empty()) continue;
    ToolUse use{doc, line, tool, {}};
    for (size_t j = i + 1; j < words.size(); ++j) {
      std::string w = words[j];
      if (w == "|" || w == "&&" || w == ";" || w == "||" || w[0] == '#') break;
      w.erase(0, w.find_first_not_of("[("));
      if (w.rfind("--", 0) != 0 || w.size() < 3) continue;
      w = w.substr(0, w.find_first_of("=]),"));
      use.flags.push_back(w);
    }
    out.push_back(std::move(use));
  }
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Every use of a tool in the shell blocks and inline code spans of `text` (the file `doc`).
std::vector<ToolUse> tool_uses(const std::string& doc, const std::string& text) {
  std::vector<ToolUse> out;
  std::istringstream in(text);
  std::string line, prose;
  std::vector<int> prose_lines;  // the doc line of each character of `prose`
  bool in_block = false, shell = false;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string body = ltrim(line);
    if (body.rfind("```", 0) == 0) {
      in_block = !in_block;
      const std::string lang = rtrim(body.substr(3));
      shell = in_block && (lang == "sh" || lang == "bash");
      continue;
    }
    if (!in_block) {
      prose += line + "\n";
      prose_lines.resize(prose.size(), n);
    } else if (shell && body.find(kSkipMark) == std::string::npos) {
      collect_uses(doc, n, split_words(line), false, out);
    }
  }
  // Inline spans may wrap across lines of a paragraph.
  const std::regex span("`([^`]+)`");
  for (auto it = std::sregex_iterator(prose.begin(), prose.end(), span);
       it != std::sregex_iterator(); ++it) {
    const std::vector<std::string> words = split_words((*it)[1].str());
    if (!words.empty())
      collect_uses(doc, prose_lines[static_cast<size_t>(it->position(0))], words, true, out);
  }
  return out;
}

// The options `tool --help` lists.
const std::vector<std::string>& help_flags(const std::string& tool) {
  static std::map<std::string, std::vector<std::string>> cache;
  auto [it, fresh] = cache.try_emplace(tool);
  if (fresh) {
    const CommandResult r = testing::run_command(
        {std::string(STRATA_BINARY_DIR) + "/" + tool, "--help"}, std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 0) << tool << " --help: " << r.err;
    const std::regex flag("--[a-z0-9][a-z0-9-]*");
    const std::string text = r.out + r.err;
    for (auto m = std::sregex_iterator(text.begin(), text.end(), flag); m != std::sregex_iterator();
         ++m)
      it->second.push_back(m->str());
  }
  return it->second;
}

// The flags of `use` that its tool does not take, as one message, or nullopt.
std::optional<std::string> unknown_flags(const ToolUse& use) {
  const std::vector<std::string>& known = help_flags(use.tool);
  std::string bad;
  for (const std::string& f : use.flags)
    if (std::find(known.begin(), known.end(), f) == known.end())
      bad += (bad.empty() ? "" : ", ") + f;
  if (bad.empty()) return std::nullopt;
  return fmt::format("{}:{}: `{}` has no option {} (its --help lists it all)", use.doc, use.line,
                     use.tool, bad);
}

TEST(DocsSnippets, EveryConfigFileLoads) {
  int checked = 0;
  for (const auto& e : fs::directory_iterator(kSource / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    ++checked;
    const std::optional<std::string> error =
        print_config_error({"--config", e.path().string()}, kSource.string());
    EXPECT_FALSE(error) << fs::relative(e.path(), kSource).string() << ": " << *error;
  }
  EXPECT_GE(checked, 1) << "configs/ holds no .yaml file";
}

TEST(DocsSnippets, EveryYamlBlockOfTheDocsLoads) {
  const SnippetDir dir;
  int checked = 0;
  for (const Block& b : yaml_blocks()) {
    if (skipped(b)) {
      EXPECT_GT(ltrim(b.lines.front().substr(std::string(kSkipMark).size())).size(), 1u)
          << b.doc << ":" << b.line + 1 << ": '" << kSkipMark << "' needs a reason: '" << kSkipMark
          << ": <why>'";
      continue;
    }
    ++checked;
    const std::optional<std::string> error = dir.check(b);
    EXPECT_FALSE(error) << *error;
  }
  EXPECT_GE(checked, 1) << "no ```yaml block found in README.md or docs/";
}

TEST(DocsSnippets, EveryTrainCommandOfTheDocsLoads) {
  const std::vector<Command> commands = train_commands();
  for (const Command& c : commands) {
    const std::optional<std::string> error = check(c);
    EXPECT_FALSE(error) << *error;
  }
  EXPECT_GE(commands.size(), 1u) << "no `bin/train` command found in README.md or docs/";
}

// The check can fail: a key of a documented block, renamed in a copy, is an error that names
// the doc, the key's line in it and the unknown key.
TEST(DocsSnippets, ARenamedKeyInABlockFailsNamingTheDocAndLine) {
  const SnippetDir dir;
  int renamed = 0;
  for (const Block& original : yaml_blocks()) {
    if (skipped(original) || dir.check(original)) continue;
    // The first key of the block that is not `base`: "  key: value" -> "  keyx_renamed: value".
    Block b = original;
    for (size_t i = 0; i < b.lines.size(); ++i) {
      const std::string body = ltrim(b.lines[i]);
      const size_t colon = body.find(':');
      if (body.empty() || body[0] == '#' || body[0] == '-' || colon == std::string::npos ||
          body.rfind("base:", 0) == 0)
        continue;
      const std::string key = body.substr(0, colon);
      const std::string bad = key + "x_renamed";
      b.lines[i].replace(b.lines[i].size() - body.size(), key.size(), bad);
      const std::optional<std::string> error = dir.check(b);
      ASSERT_TRUE(error) << b.doc << ":" << b.line << ": renaming '" << key << "' to '" << bad
                         << "' on the block's line " << i + 1 << " was not refused";
      const std::string place = fmt::format("{}:{}", b.doc, b.line + 1 + static_cast<int>(i));
      EXPECT_NE(error->find(place), std::string::npos) << "no '" << place << "' in: " << *error;
      EXPECT_NE(error->find("unknown key '" + bad + "'"), std::string::npos) << *error;
      ++renamed;
      break;
    }
  }
  EXPECT_GE(renamed, 1) << "no ```yaml block that loads to rename a key of";
}

TEST(DocsSnippets, ARenamedKeyInATrainCommandFails) {
  int renamed = 0;
  for (Command c : train_commands()) {
    auto set = std::find(c.args.begin(), c.args.end(), "--set");
    if (set == c.args.end() || check(c)) continue;
    std::string& assignment = *(set + 1);  // "a.b=value" -> "a.bx_renamed=value"
    assignment.insert(assignment.find('='), "x_renamed");
    const std::optional<std::string> error = check(c);
    ASSERT_TRUE(error) << c.doc << ":" << c.line << ": --set " << assignment << " was accepted";
    EXPECT_NE(error->find(fmt::format("{}:{}", c.doc, c.line)), std::string::npos) << *error;
    const std::string key = assignment.substr(0, assignment.find('='));
    EXPECT_NE(error->find(key.substr(key.rfind('.') + 1)), std::string::npos) << *error;
    ++renamed;
  }
  EXPECT_GE(renamed, 1) << "no documented train command with --set to rename a key of";
}

TEST(DocsSnippets, EveryToolOptionOfTheDocsExists) {
  int uses = 0;
  for (const std::string& doc : doc_files()) {
    for (const ToolUse& use : tool_uses(doc, testing::read_text((kSource / doc).string()))) {
      ++uses;
      const std::optional<std::string> error = unknown_flags(use);
      EXPECT_FALSE(error) << *error;
    }
  }
  EXPECT_GE(uses, 1) << "no tool command found in README.md or docs/";
}

TEST(DocsSnippets, AnOptionNoToolTakesIsFoundInBlocksAndProse) {
  const std::string text =
      "Run `generate --checkpoint runs/x --top-k 40\n"
      "--top-kk 5` or `convert --verify`.\n"
      "```sh\n"
      "mpirun -np 2 build/bin/train --config c.yaml --set a=1 --no-such-flag  # --ignored\n"
      "```\n";
  const std::vector<ToolUse> uses = tool_uses("t.md", text);
  ASSERT_EQ(uses.size(), 3u);
  EXPECT_EQ(uses[0].tool, "train");
  EXPECT_EQ(uses[0].line, 4);
  const std::optional<std::string> train = unknown_flags(uses[0]);
  ASSERT_TRUE(train);
  EXPECT_NE(train->find("t.md:4: `train` has no option --no-such-flag"), std::string::npos)
      << *train;
  EXPECT_EQ(uses[1].tool, "generate");
  EXPECT_EQ(uses[1].line, 1);
  const std::optional<std::string> generate = unknown_flags(uses[1]);
  ASSERT_TRUE(generate);
  EXPECT_NE(generate->find("has no option --top-kk"), std::string::npos) << *generate;
  EXPECT_EQ(generate->find("--top-k,"), std::string::npos) << *generate;
  EXPECT_FALSE(unknown_flags(uses[2]));
}

TEST(DocsSnippets, FencesAndCommandsAreFoundWhereverTheyAreIndented) {
  // The parser on a doc of the test's own: a block indented in a list item, a skipped block,
  // and a shell block with a continuation line, a launcher and a comment.
  ScratchDir tmp;
  testing::write_text(tmp / "t.md",
                      "# t\n"
                      "- item:\n"
                      "\n"
                      "  ```yaml\n"
                      "  run:\n"
                      "    seed: 3\n"
                      "  ```\n"
                      "```yaml\n"
                      "# not-a-config: an example of an error\n"
                      "```\n"
                      "```sh\n"
                      "mpirun -np 2 build/bin/train --config configs/default.yaml \\\n"
                      "    --set training.steps=3 --print-config  # comment --set a.b=1\n"
                      "build/bin/train --config x.yaml  # not-a-config: a placeholder\n"
                      "```\n");
  const std::vector<Block> blocks = fenced_blocks(tmp / "t.md", "t.md");
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].line, 4);
  EXPECT_EQ(blocks[0].lang, "yaml");
  EXPECT_EQ(join(blocks[0].lines), "run:\n  seed: 3\n");
  EXPECT_FALSE(skipped(blocks[0]));
  EXPECT_TRUE(skipped(blocks[1]));
  EXPECT_EQ(blocks[2].lang, "sh");
  const std::vector<Command> commands = train_commands(blocks);
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_EQ(commands[0].line, 12);
  EXPECT_EQ(commands[0].args, (std::vector<std::string>{"--config", "configs/default.yaml", "--set",
                                                        "training.steps=3"}));
}

}  // namespace
}  // namespace strata::tools
