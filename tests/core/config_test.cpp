#include "core/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

namespace strata::config {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("strata_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

  fs::path dir_;
};

// The message of the UserError `f` raises ("" and a test failure when it raises none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError raised";
  return "";
}

#define EXPECT_CONTAINS(text, part)                                                                \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" \
                                                             << (text)

TEST_F(ConfigTest, ParseKeepsOrderAndSources) {
  Node n = parse_string("zeta: 1\nalpha:\n  b: [1, 2]\n  a: x\n", "f.yaml");
  ASSERT_TRUE(n.is_map());
  ASSERT_EQ(n.size(), 2u);
  EXPECT_EQ(n.key(0), "zeta");  // insertion order, not sorted
  EXPECT_EQ(n.key(1), "alpha");
  EXPECT_EQ(n.key_source(1).str(), "f.yaml:2:1");
  const Node* alpha = n.find("alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->key(0), "b");
  EXPECT_EQ(alpha->find("a")->value(), "x");
  EXPECT_EQ(alpha->find("a")->source().str(), "f.yaml:4:6");
  EXPECT_TRUE(alpha->find("b")->is_sequence());
  EXPECT_EQ(alpha->find("b")->item(1).value(), "2");
  EXPECT_EQ(n.find("missing"), nullptr);
}

TEST_F(ConfigTest, SyntaxErrorNamesFileLineAndColumn) {
  std::string path = write("broken.yaml", "run:\n  dir: [a, b\n  seed: 1\n");
  std::string msg = error_of([&] { load_file(path); });
  EXPECT_CONTAINS(msg, path + ":");
  EXPECT_CONTAINS(msg, "invalid YAML");
}

TEST_F(ConfigTest, DuplicateKeyIsAnError) {
  std::string msg = error_of([] { parse_string("a: 1\nb: 2\na: 3\n", "dup.yaml"); });
  EXPECT_CONTAINS(msg, "dup.yaml:3:1");
  EXPECT_CONTAINS(msg, "duplicate key 'a'");
  EXPECT_CONTAINS(msg, "line 1");
}

TEST_F(ConfigTest, MissingFileAndNonMapTopLevel) {
  std::string missing = (dir_ / "nope.yaml").string();
  std::string msg = error_of([&] { load_file(missing); });
  EXPECT_CONTAINS(msg, missing);
  EXPECT_CONTAINS(msg, "not found");

  std::string list = write("list.yaml", "- a\n- b\n");
  msg = error_of([&] { load_file(list); });
  EXPECT_CONTAINS(msg, list);
  EXPECT_CONTAINS(msg, "must be a map");
  EXPECT_CONTAINS(msg, "a list");

  std::string empty = write("empty.yaml", "# nothing\n");
  msg = error_of([&] { load_file(empty); });
  EXPECT_CONTAINS(msg, empty);
  EXPECT_CONTAINS(msg, "empty document");

  msg = error_of([&] { load_file(dir_.string()); });
  EXPECT_CONTAINS(msg, "is a directory");
}

TEST_F(ConfigTest, BaseChainMergesDeeplyChildWins) {
  write("presets/root.yaml",
        "run:\n  dir: root\n  seed: 1\nopt:\n  betas: [0.1, 0.2, 0.3]\n  lr: 1\nonly_root: r\n");
  write("presets/mid.yaml", "base: root.yaml\nrun:\n  seed: 2\nopt:\n  betas: [0.5]\n");
  std::string top = write("top.yaml", "base: presets/mid.yaml\nrun:\n  dir: top\nopt:\n  eps: 3\n");
  Node n = load_file(top);
  EXPECT_EQ(n.find("base"), nullptr);  // consumed
  const Node* run = n.find("run");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->find("dir")->value(), "top");
  EXPECT_EQ(run->find("seed")->value(), "2");
  // A key keeps the position where it first appeared (root's order), new keys are appended.
  EXPECT_EQ(run->key(0), "dir");
  EXPECT_EQ(run->key(1), "seed");
  const Node* opt = n.find("opt");
  // Sequences are replaced whole, never appended to.
  ASSERT_EQ(opt->find("betas")->size(), 1u);
  EXPECT_EQ(opt->find("betas")->item(0).value(), "0.5");
  EXPECT_EQ(opt->find("lr")->value(), "1");
  EXPECT_EQ(opt->find("eps")->value(), "3");
  EXPECT_EQ(n.find("only_root")->value(), "r");
  // Sources point into the file that wrote the winning value (Note [Config sources]).
  EXPECT_EQ(opt->find("lr")->source().file, (dir_ / "presets/root.yaml").string());
  EXPECT_EQ(opt->find("lr")->source().line, 6);
  EXPECT_EQ(run->find("seed")->source().file, (dir_ / "presets/mid.yaml").string());
  EXPECT_EQ(run->find("dir")->source().file, top);
}

TEST_F(ConfigTest, BaseListAppliesInOrder) {
  write("a.yaml", "x: a\ny: a\nz: a\n");
  write("b.yaml", "y: b\nz: b\n");
  std::string top = write("top.yaml", "base: [a.yaml, b.yaml]\nz: top\n");
  Node n = load_file(top);
  EXPECT_EQ(n.find("x")->value(), "a");
  EXPECT_EQ(n.find("y")->value(), "b");
  EXPECT_EQ(n.find("z")->value(), "top");
}

TEST_F(ConfigTest, BaseCycleNamesTheChain) {
  std::string a = write("a.yaml", "base: b.yaml\nx: 1\n");
  write("b.yaml", "base: c.yaml\n");
  write("c.yaml", "base: a.yaml\n");
  std::string msg = error_of([&] { load_file(a); });
  EXPECT_CONTAINS(msg, "inheritance cycle");
  EXPECT_CONTAINS(msg, "a.yaml -> ");
  EXPECT_CONTAINS(msg, "b.yaml -> ");
  EXPECT_CONTAINS(msg, "c.yaml -> ");
  // Reported where the cycle closes: c.yaml's base: line.
  EXPECT_CONTAINS(msg, (dir_ / "c.yaml").string() + ":1:7");

  std::string self = write("self.yaml", "base: ./self.yaml\n");
  msg = error_of([&] { load_file(self); });
  EXPECT_CONTAINS(msg, "inheritance cycle");
}

TEST_F(ConfigTest, BadBaseEntries) {
  std::string missing = write("m.yaml", "x: 1\nbase: nothere.yaml\n");
  std::string msg = error_of([&] { load_file(missing); });
  EXPECT_CONTAINS(msg, missing + ":2:7");
  EXPECT_CONTAINS(msg, "nothere.yaml");
  EXPECT_CONTAINS(msg, "not found");

  std::string map = write("map.yaml", "base:\n  file: x.yaml\n");
  msg = error_of([&] { load_file(map); });
  EXPECT_CONTAINS(msg, map + ":2:3");
  EXPECT_CONTAINS(msg, "base: expected a file path or a list");

  std::string nested = write("nested.yaml", "base: [[a.yaml]]\n");
  msg = error_of([&] { load_file(nested); });
  EXPECT_CONTAINS(msg, nested + ":1:8");
  EXPECT_CONTAINS(msg, "expected a file path, got a list");
}

TEST_F(ConfigTest, SetOverrides) {
  Node n = parse_string("optimizer:\n  lr: 1\n  betas: [0.9, 0.95]\nrun:\n  dir: x\n", "f.yaml");
  apply_set(n, "optimizer.lr=3e-4");
  apply_set(n, "optimizer.betas=[0.9,0.99]");
  apply_set(n, "model.config.n_layer=4");  // creates model and model.config
  apply_set(n, " run.dir = out/run ");
  apply_set(n, "training.sample_prompt=a=b");  // only the first '=' splits
  EXPECT_EQ(n.find("optimizer")->find("lr")->value(), "3e-4");
  EXPECT_EQ(n.find("optimizer")->find("lr")->source().str(), "--set");
  const Node* betas = n.find("optimizer")->find("betas");
  ASSERT_TRUE(betas->is_sequence());
  ASSERT_EQ(betas->size(), 2u);
  EXPECT_EQ(betas->item(1).value(), "0.99");
  EXPECT_EQ(n.find("model")->find("config")->find("n_layer")->value(), "4");
  EXPECT_EQ(n.find("run")->find("dir")->value(), "out/run");
  EXPECT_EQ(n.find("training")->find("sample_prompt")->value(), "a=b");
  // The replaced key keeps its position.
  EXPECT_EQ(n.find("optimizer")->key(0), "lr");
}

TEST_F(ConfigTest, MalformedSetIsAnError) {
  Node n = parse_string("run:\n  dir: x\n", "f.yaml");
  for (const char* bad : {"optimizer.lr", "=3", "a..b=1", "a.=1", ".a=1", ""}) {
    std::string msg = error_of([&] { apply_set(n, bad); });
    EXPECT_CONTAINS(msg, "--set a.b=c expects key=value");
  }
  std::string msg = error_of([&] { apply_set(n, "run.dir.sub=1"); });
  EXPECT_CONTAINS(msg, "'run.dir' (f.yaml:2:8) is a scalar, not a section");
  msg = error_of([&] { apply_set(n, "optimizer.betas=[0.9,"); });
  EXPECT_CONTAINS(msg, "--set 'optimizer.betas=[0.9,': the value is not valid YAML");
}

TEST_F(ConfigTest, ReaderConvertsTypes) {
  Node n = parse_string(
      "flag: yes\ncount: -12\nbig: 18446744073709551615\nlr: 6e-4\nname: x\nlist: [1, 2, 3]\n"
      "words: [a, b]\nempty:\nchoice: bar\nmap: {a: 1, b: two}\n",
      "t.yaml");
  Reader r(n, "", "t.yaml");
  bool flag = false;
  int64_t count = 0;
  uint64_t big = 0;
  double lr = 0;
  std::string name, empty = "unchanged", choice;
  std::vector<int64_t> list;
  std::vector<std::string> words;
  std::map<std::string, std::string> map;
  int absent = 7;
  EXPECT_TRUE(r.get("flag", flag));
  EXPECT_TRUE(r.get("count", count));
  EXPECT_TRUE(r.get("big", big));
  EXPECT_TRUE(r.get("lr", lr));
  EXPECT_TRUE(r.get("name", name));
  EXPECT_TRUE(r.get("list", list));
  EXPECT_TRUE(r.get("words", words));
  EXPECT_TRUE(r.get("empty", empty));
  EXPECT_TRUE(r.get_enum("choice", choice, {"foo", "bar"}));
  EXPECT_TRUE(r.get("map", map));
  EXPECT_FALSE(r.get("absent", absent));
  r.finish();
  EXPECT_TRUE(flag);
  EXPECT_EQ(count, -12);
  EXPECT_EQ(big, UINT64_MAX);
  EXPECT_DOUBLE_EQ(lr, 6e-4);
  EXPECT_EQ(name, "x");
  EXPECT_EQ(list, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(words, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(empty, "");  // null reads as an empty string
  EXPECT_EQ(choice, "bar");
  EXPECT_EQ(map, (std::map<std::string, std::string>{{"a", "1"}, {"b", "two"}}));
  EXPECT_EQ(absent, 7);
}

TEST_F(ConfigTest, WrongTypesNameLocationKeyAndValue) {
  Node n = parse_string(
      "optimizer:\n  lr: fast\n  steps: 1.5\n  flag: maybe\n  list: 3\n  eps:\n  neg: -1\n"
      "  huge: 99999999999999999999\n  section: 4\n  words: [a, [b]]\n  inf: .inf\n",
      "configs/x.yaml");
  Reader top(n, "", "configs/x.yaml");
  Reader r = top.section("optimizer");
  double d;
  int64_t i;
  uint64_t u;
  bool b;
  std::vector<double> v;
  std::vector<std::string> w;
  EXPECT_EQ(error_of([&] { r.get("lr", d); }),
            "configs/x.yaml:2:7: optimizer.lr: expected a number, got 'fast'");
  EXPECT_EQ(error_of([&] { r.get("steps", i); }),
            "configs/x.yaml:3:10: optimizer.steps: expected an integer, got '1.5'");
  EXPECT_EQ(error_of([&] { r.get("flag", b); }),
            "configs/x.yaml:4:9: optimizer.flag: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of([&] { r.get("list", v); }),
            "configs/x.yaml:5:9: optimizer.list: expected a list, got '3'");
  EXPECT_CONTAINS(error_of([&] { r.get("eps", d); }), "optimizer.eps: expected a number, got null");
  EXPECT_EQ(error_of([&] { r.get("neg", u); }),
            "configs/x.yaml:7:8: optimizer.neg: expected a non-negative integer, got '-1'");
  EXPECT_CONTAINS(error_of([&] { r.get("huge", i); }),
                  "optimizer.huge: 99999999999999999999 is "
                  "out of range");
  EXPECT_CONTAINS(error_of([&] { r.section("section"); }),
                  "configs/x.yaml:9:12: optimizer.section: expected a section (a map of keys), "
                  "got '4'");
  EXPECT_CONTAINS(error_of([&] { r.get("words", w); }),
                  "configs/x.yaml:10:14: optimizer.words[1]: expected a string, got a list");
  EXPECT_CONTAINS(error_of([&] { r.get("inf", d); }), "optimizer.inf: expected a number");
}

TEST_F(ConfigTest, EnumErrorListsAllowedValues) {
  Node n = parse_string("run:\n  device: cdua\n", "e.yaml");
  Reader r = Reader(n, "", "e.yaml").section("run");
  std::string device;
  EXPECT_EQ(error_of([&] {
              r.get_enum("device", device, {"cpu", "cuda"});
            }),
            "e.yaml:2:11: run.device: expected one of cpu, cuda, got 'cdua'; did you mean "
            "'cuda'?");
}

TEST_F(ConfigTest, RequireNamesFileAndKey) {
  Node n = parse_string("data:\n  val: x\n", "r.yaml");
  Reader top(n, "", "r.yaml");
  Reader data = top.section("data");
  std::string train;
  EXPECT_EQ(error_of([&] { data.require("train", train); }),
            "r.yaml: missing required key 'data.train'");
}

TEST_F(ConfigTest, FinishReportsUnknownKeysWithSuggestions) {
  Node n = parse_string(
      "run:\n  dir: x\noptimiser:\n  lr: 1\nbatch:\n  seq_len: 4\n  micro_batch: 2\n"
      "  zzzz: 1\n",
      "configs/x.yaml");
  Reader top(n, "", "configs/x.yaml");
  Reader run = top.section("run");
  Reader opt = top.section("optimizer");
  Reader batch = top.section("batch");
  std::string dir;
  int64_t seq_len = 0, micro = 0;
  double lr = 0;
  run.get("dir", dir);
  opt.get("lr", lr);
  batch.get("seq_len", seq_len);
  batch.get("micro_batch_size", micro);
  std::string msg = error_of([&] { top.finish(); });
  // Every unknown key, one line each, in the top-level section and the nested ones.
  EXPECT_CONTAINS(msg,
                  "configs/x.yaml:3:1: unknown key 'optimiser' in section 'root'; did you mean "
                  "'optimizer'?");
  EXPECT_CONTAINS(msg,
                  "configs/x.yaml:7:3: unknown key 'micro_batch' in section 'batch'; did you "
                  "mean 'micro_batch_size'?");
  // Nothing close: the valid keys are listed instead.
  EXPECT_CONTAINS(msg,
                  "configs/x.yaml:8:3: unknown key 'zzzz' in section 'batch'; valid keys: "
                  "seq_len, micro_batch_size");
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 2);
  // A section's own finish() sees only its keys.
  EXPECT_NO_THROW(run.finish());
}

TEST_F(ConfigTest, FinishPassesWhenEverythingWasRead) {
  Node n = parse_string("a: 1\nb:\n  c: 2\n", "ok.yaml");
  Reader top(n, "", "ok.yaml");
  int64_t a = 0, c = 0;
  top.get("a", a);
  top.section("b").get("c", c);
  EXPECT_NO_THROW(top.finish());
  EXPECT_EQ(a + c, 3);
}

TEST_F(ConfigTest, RangeChecks) {
  Node n = parse_string("batch:\n  size: 0\n  frac: 1.0\n", "g.yaml");
  Reader r = Reader(n, "", "g.yaml").section("batch");
  EXPECT_EQ(error_of([&] { r.positive("size", 0); }),
            "g.yaml:2:9: batch.size: must be positive, got 0");
  EXPECT_EQ(error_of([&] { r.non_negative("size", -2); }),
            "g.yaml:2:9: batch.size: must be >= 0, got -2");
  EXPECT_EQ(error_of([&] { r.in_range("frac", 1.0, 0.0, 1.0); }),
            "g.yaml:3:9: batch.frac: must be in [0, 1), got 1");
  EXPECT_NO_THROW(r.in_range("frac", 1.0, 0.0, 1.0, /*hi_inclusive=*/true));
  EXPECT_NO_THROW(r.positive("size", 3));
  // An absent key (a default value) is reported against the file.
  EXPECT_EQ(error_of([&] { r.positive("other", -1); }),
            "g.yaml: batch.other: must be positive, got -1");
}

TEST(ConfigSuggest, NearestByEditDistance) {
  EXPECT_EQ(edit_distance("optimiser", "optimizer"), 1u);
  EXPECT_EQ(edit_distance("epcoh", "epoch"), 1u);  // adjacent transposition
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  const std::vector<std::string> keys{"lr", "eps", "betas", "weight_decay", "warmup_steps"};
  EXPECT_EQ(nearest("weight_decy", keys), "weight_decay");
  EXPECT_EQ(nearest("LR", keys), "lr");
  EXPECT_EQ(nearest("warmup", keys), "warmup_steps");  // a shortened name
  EXPECT_EQ(nearest("xy", keys), "");                  // two edits in two letters is no typo
  EXPECT_EQ(nearest("momentum", keys), "");
  // A shortened name holds whole words of the other, not any run of letters.
  const std::vector<std::string> batch{"micro_batch_size", "grad_accum_steps", "seq_len"};
  EXPECT_EQ(nearest("eps", batch), "");  // not "grad_accum_steps", which only spells it
  EXPECT_EQ(nearest("grad_accum", batch), "grad_accum_steps");
  EXPECT_EQ(nearest("batch_size", batch), "micro_batch_size");
  EXPECT_EQ(nearest("micro_batch_size_per_gpu", batch), "micro_batch_size");
}

TEST(ConfigEmit, ToYamlRoundTrips) {
  const std::string text =
      "run:\n  dir: out\n  seed: 1\nweird:\n  empty: \"\"\n  nullword: \"null\"\n  tilde: \"~\"\n"
      "  colon: \"a: b\"\n  hash: \"#x\"\n  newline: \"line\\nnext\"\n  dash: \"- x\"\n"
      "  none: ~\n  emptymap: {}\n  emptylist: []\n  after: {k: v}\nlists:\n  flat: [1, 2]\n"
      "  nested: [[1], {a: b}]\n";
  Node n = parse_string(text, "f.yaml");
  std::string once = to_yaml(n);
  Node back = parse_string(once, "g.yaml");
  EXPECT_EQ(to_yaml(back), once);
  const Node* weird = back.find("weird");
  EXPECT_EQ(weird->find("empty")->value(), "");
  EXPECT_EQ(weird->find("nullword")->value(), "null");
  EXPECT_EQ(weird->find("tilde")->value(), "~");
  EXPECT_EQ(weird->find("colon")->value(), "a: b");
  EXPECT_EQ(weird->find("hash")->value(), "#x");
  EXPECT_EQ(weird->find("newline")->value(), "line\nnext");
  EXPECT_EQ(weird->find("dash")->value(), "- x");
  EXPECT_TRUE(weird->find("none")->is_null());
  EXPECT_TRUE(weird->find("emptymap")->is_map());
  EXPECT_TRUE(weird->find("emptylist")->is_sequence());
  // yaml-cpp 0.7 leaks flow style from an empty flow list to the next map; we force block style.
  EXPECT_NE(once.find("  after:\n    k: v\n"), std::string::npos) << once;
  EXPECT_NE(once.find("flat: [1, 2]"), std::string::npos) << once;
  EXPECT_EQ(back.find("lists")->find("nested")->item(1).find("a")->value(), "b");
}

TEST(ConfigEmit, CommentsAreWritten) {
  Node n = parse_string("a: 1\n", "f.yaml");
  n.find("a")->set_comment("derived: 1");
  EXPECT_EQ(to_yaml(n), "a: 1  # derived: 1\n");
}

}  // namespace
}  // namespace strata::config
