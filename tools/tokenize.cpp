// tokenize: text files -> token shards (data/token_shard.h) for `train`.
//
//   tokenize --tokenizer byte|gpt2 [--vocab F --merges F] --output DIR [--val-fraction 0.05]
//            [--shard-tokens 100000000] [--format text|fortune] INPUT...
//
// Each document is encoded and followed by the tokenizer's end-of-text token (a "\n" byte for
// the byte tokenizer, which has none). Every round(1/val_fraction)-th document goes to the
// validation split, so the split is deterministic and does not depend on the shard size.
// Shards are DIR/train_000000.bin, ... and DIR/val_000000.bin, ...; each is written atomically.
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace strata::tools {
using namespace strata::data;  // this binary's library
namespace {

struct Options {
  std::string tokenizer = "byte";
  std::string vocab, merges;
  std::string output;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  std::string format = "text";
  std::vector<std::string> inputs;
};

// Files named on the command line, a directory standing for its regular files (sorted).
std::vector<fs::path> input_files(const Options& o) {
  std::vector<fs::path> files;
  for (const std::string& in : o.inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) user_error("{}: input does not exist", in);
    if (fs::is_directory(st)) {
      std::vector<fs::path> dir;
      for (const auto& e : fs::directory_iterator(in, ec)) {
        if (!e.is_regular_file()) continue;
        const std::string ext = e.path().extension().string();
        // The fortunes package keeps binary strfile indexes (.dat) and .u8 links beside the text.
        if (o.format == "fortune" && (ext == ".dat" || ext == ".u8")) continue;
        dir.push_back(e.path());
      }
      if (ec) user_error("{}: cannot list directory ({})", in, ec.message());
      std::sort(dir.begin(), dir.end());
      if (dir.empty()) user_error("{}: directory holds no regular files to tokenize", in);
      files.insert(files.end(), dir.begin(), dir.end());
    } else if (fs::is_regular_file(st)) {
      files.emplace_back(in);
    } else {
      user_error("{}: not a regular file or directory", in);
    }
  }
  return files;
}

// fortune format: documents separated by lines holding just "%". Empty documents are dropped.
std::vector<std::string> split_documents(std::string text, const std::string& format) {
  std::vector<std::string> docs;
  if (format == "text") {
    if (!text.empty()) docs.push_back(std::move(text));
    return docs;
  }
  std::string cur;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string::npos ? text.size() : eol + 1;
    std::string_view line(text.data() + pos, next - pos);
    std::string_view bare = line;
    while (!bare.empty() && (bare.back() == '\n' || bare.back() == '\r')) bare.remove_suffix(1);
    if (bare == "%") {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.append(line);
    }
    pos = next;
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

// Accumulates one split's tokens and writes full shards as they fill.
class ShardWriter {
 public:
  ShardWriter(fs::path dir, std::string split, int64_t shard_tokens, int32_t vocab_size)
      : dir_(std::move(dir)),
        split_(std::move(split)),
        shard_tokens_(shard_tokens),
        vocab_size_(vocab_size) {}

  void add(const std::vector<int32_t>& ids, int32_t separator) {
    for (int32_t id : ids) push(id);
    push(separator);
    ++documents_;
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  int shards() const { return shards_; }

 private:
  void push(int32_t id) {
    STRATA_CHECK(id >= 0 && id < vocab_size_, "token {} outside vocab {}", id, vocab_size_);
    buf_.push_back(static_cast<uint16_t>(id));
    ++tokens_;
    if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
  }
  void flush() {
    const fs::path path = dir_ / fmt::format("{}_{:06d}.bin", split_, shards_);
    write_token_shard(path.string(), buf_, vocab_size_);
    fmt::print("wrote {} ({} tokens)\n", path.string(), buf_.size());
    std::fflush(stdout);
    buf_.clear();
    ++shards_;
  }

  fs::path dir_;
  std::string split_;
  int64_t shard_tokens_;
  int32_t vocab_size_;
  std::vector<uint16_t> buf_;
  int64_t documents_ = 0, tokens_ = 0;
  int shards_ = 0;
};

// Shards left by an earlier run into the same directory with indices this run did not reach:
// removed, or a later glob of DIR/train_*.bin would mix old data into the new set.
int remove_stale_shards(const fs::path& dir, const std::string& split, int written) {
  const std::regex name(split + "_([0-9]{6})\\.bin");
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string fname = e.path().filename().string();
    if (std::regex_match(fname, m, name) && std::stoi(m[1].str()) >= written) {
      fs::remove(e.path(), ec);
      if (ec) user_error("{}: cannot remove stale shard ({})", e.path().string(), ec.message());
      ++removed;
    }
  }
  return removed;
}

void run(const Options& o) {
  if (o.format != "text" && o.format != "fortune")
    user_error("--format {}: choose text or fortune", o.format);
  if (!(o.val_fraction >= 0.0 && o.val_fraction <= 0.5))
    user_error("--val-fraction {}: must be in [0, 0.5]", o.val_fraction);
  if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX)
    user_error("--shard-tokens {}: must be in [1, {}]", o.shard_tokens, INT32_MAX);
  auto tok = make_tokenizer(o.tokenizer, o.vocab, o.merges);
  if (tok->vocab_size() > 65536)
    user_error("{}: vocabulary of {} does not fit token shards (uint16 ids, at most 65536 entries)",
               o.vocab.empty() ? o.tokenizer : o.vocab, tok->vocab_size());
  const int32_t separator = tok->eot_token() >= 0 ? tok->eot_token() : tok->encode("\n").at(0);
  const std::vector<fs::path> files = input_files(o);

  const fs::path dir(o.output);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    user_error("{}: cannot create the output directory ({})", o.output,
               ec ? ec.message() : "a file is in the way");
  if (::access(dir.c_str(), W_OK) != 0)
    user_error("{}: output directory is not writable", o.output);

  const int64_t val_every =
      o.val_fraction > 0 ? static_cast<int64_t>(std::llround(1.0 / o.val_fraction)) : 0;
  ShardWriter train(dir, "train", o.shard_tokens, tok->vocab_size());
  ShardWriter val(dir, "val", o.shard_tokens, tok->vocab_size());
  int64_t doc_index = 0;
  for (const fs::path& f : files) {
    for (const std::string& doc : split_documents(read_whole_file(f.string()), o.format)) {
      ++doc_index;
      const bool to_val = val_every > 0 && doc_index % val_every == 0;
      (to_val ? val : train).add(tok->encode(doc), separator);
    }
  }
  if (doc_index == 0) user_error("{}: no documents found in the inputs", o.inputs.front());
  train.finish();
  val.finish();
  int stale = remove_stale_shards(dir, "train", train.shards()) +
              remove_stale_shards(dir, "val", val.shards());
  fmt::print("documents: {} (train {}, val {})\n", doc_index, train.documents(), val.documents());
  fmt::print("tokens: {} (train {}, val {}), tokenizer {} (vocab {})\n",
             train.tokens() + val.tokens(), train.tokens(), val.tokens(), tok->name(),
             tok->vocab_size());
  fmt::print("files written: {} ({} train, {} val) in {}\n", train.shards() + val.shards(),
             train.shards(), val.shards(), o.output);
  if (stale > 0) fmt::print("removed {} stale shard(s) left by an earlier run\n", stale);
  if (val.documents() == 0) fmt::print("note: no validation documents (raise --val-fraction)\n");
}

}  // namespace
}  // namespace strata::tools

int main(int argc, char** argv) {
  strata::tools::Options o;
  CLI::App app{"tokenize: text files -> token shards (llm.c/nanoGPT .bin format) for train"};
  app.add_option("--tokenizer", o.tokenizer, "byte or gpt2")
      ->check(CLI::IsMember({"byte", "gpt2"}))
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "GPT-2 vocab.json (gpt2 tokenizer)");
  app.add_option("--merges", o.merges, "GPT-2 merges.txt (gpt2 tokenizer)");
  app.add_option("--output", o.output, "directory for train_*.bin and val_*.bin")->required();
  app.add_option("--val-fraction", o.val_fraction,
                 "share of documents for validation (every round(1/f)-th document)")
      ->capture_default_str();
  app.add_option("--shard-tokens", o.shard_tokens, "tokens per shard")->capture_default_str();
  app.add_option("--format", o.format,
                 "text: each file is one document; fortune: documents separated by '%' lines")
      ->check(CLI::IsMember({"text", "fortune"}))
      ->capture_default_str();
  app.add_option("inputs", o.inputs, "input files or directories")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints usage and succeeds; every usage error exits 1 like the others.
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    strata::tools::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
