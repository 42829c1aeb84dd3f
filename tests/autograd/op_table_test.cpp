// The op table (tests/support/op_table.h) is complete: every op declared in the Backend interface,
// the op API and the autograd functions has an entry, and every entry has the samples the per-op
// tests need. The declarations are read from the headers at test time, so a new op cannot be
// added without its entry (docs/adding_an_op.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/op_table.h"

namespace strata::testing {
namespace {

std::string read(const std::string& rel) {
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(f.good()) << "cannot read " << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::set<std::string> matches(const std::string& text, const std::regex& re, int group) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it)
    out.insert((*it)[group].str());
  return out;
}

// The Backend's virtual methods, but device() (not an op).
std::set<std::string> backend_methods(const std::string& header) {
  std::set<std::string> s =
      matches(header, std::regex(R"(virtual\s+[\w:<>, ]*?[\s&*](\w+)\s*\()"), 1);
  s.erase("device");
  return s;
}

// Free functions of the op API: declarations at column 0 (struct members are indented), before
// the "comparisons (tests)" section, whose helpers are not ops.
std::set<std::string> api_functions(std::string header) {
  const size_t end = header.find("// ---- comparisons (tests) ----");
  if (end != std::string::npos) header.resize(end);
  return matches(header, std::regex(R"((^|\n)(inline\s+)?[A-Za-z_][\w:<>, ]*?[\s&*](\w+)\()"), 3);
}

// The op API functions that take two or more tensors (a std::vector<Tensor> counts as two), each
// with its operand count: the ones that must check their operands share a device.
std::map<std::string, int> multi_tensor_api_functions(std::string header) {
  const size_t end = header.find("// ---- comparisons (tests) ----");
  if (end != std::string::npos) header.resize(end);
  std::map<std::string, int> out;
  const std::regex decl(R"((^|\n)(inline\s+)?[A-Za-z_][\w:<>, ]*?[\s&*](\w+)\(([^)]*)\))");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), decl);
       it != std::sregex_iterator(); ++it) {
    const std::string params = (*it)[4].str();
    const std::regex tensor_param(R"(Tensor\s*&|std::vector<Tensor>)");
    int n = 0;
    for (auto p = std::sregex_iterator(params.begin(), params.end(), tensor_param);
         p != std::sregex_iterator(); ++p)
      n += p->str().find("vector") != std::string::npos ? 2 : 1;
    if (n >= 2) out[(*it)[3].str()] = n;
  }
  return out;
}

// Differentiable functions: declarations at column 0 returning Variables.
std::set<std::string> autograd_functions(const std::string& header) {
  return matches(
      header,
      std::regex(
          R"((^|\n)(Variable|std::pair<Variable, Variable>|std::vector<Variable>)\s+(\w+)\()"),
      3);
}

// What `declared` holds that `listed` lacks, as "a, b".
std::string missing(const std::set<std::string>& declared, const std::set<std::string>& listed) {
  std::string out;
  for (const std::string& n : declared)
    if (!listed.count(n)) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::set<std::string> listed(std::vector<std::string> OpInfo::*field) {
  std::set<std::string> s;
  for (const OpInfo& e : op_table())
    for (const std::string& n : e.*field) s.insert(n);
  return s;
}

TEST(OpTable, EveryBackendMethodHasAnEntry) {
  const std::set<std::string> declared = backend_methods(read("tensor/backend.h"));
  ASSERT_GE(declared.size(), 30u) << "the parse of tensor/backend.h found too little";
  ASSERT_TRUE(declared.count("matmul") && declared.count("scale_unless_equal"));
  const std::set<std::string> in_table = listed(&OpInfo::backend);
  EXPECT_EQ(missing(declared, in_table), "")
      << "Backend methods without an op table entry (tests/support/op_table*.cpp)";
  EXPECT_EQ(missing(in_table, declared), "") << "entries name Backend methods that do not exist";
}

TEST(OpTable, EveryOpApiFunctionHasAnEntry) {
  const std::set<std::string> declared = api_functions(read("tensor/ops.h"));
  ASSERT_GE(declared.size(), 40u) << "the parse of tensor/ops.h found too little";
  ASSERT_TRUE(declared.count("add") && declared.count("gelu") && declared.count("rotary_tables"));
  ASSERT_FALSE(declared.count("allclose"));
  const std::set<std::string> in_table = listed(&OpInfo::api);
  EXPECT_EQ(missing(declared, in_table), "")
      << "op API functions without an op table entry (tests/support/op_table*.cpp)";
  EXPECT_EQ(missing(in_table, declared), "") << "entries name op API functions that do not exist";
}

// Each op API function with two or more tensor operands has a mixed-device sample named after it:
// one operand on the other device must be a UserError (tests/cuda/mixed_devices_cuda_test.cpp).
TEST(OpTable, EveryMultiTensorOpHasAMixedDeviceSample) {
  const std::map<std::string, int> declared = multi_tensor_api_functions(read("tensor/ops.h"));
  ASSERT_GE(declared.size(), 30u) << "the parse of tensor/ops.h found too little";
  ASSERT_TRUE(declared.count("matmul_out") && declared.count("concat"));
  ASSERT_FALSE(declared.count("gelu"));
  // Takes tensors on several devices by contract (CudaMixedDevices.GlobalNormSumsEachTensor...).
  const std::set<std::string> exempt{"global_l2_norm"};
  std::set<std::string> in_table;
  for (const OpInfo& e : op_table())
    for (const MixedSample& m : e.mixed) {
      in_table.insert(m.name);
      EXPECT_TRUE(std::find(e.api.begin(), e.api.end(), m.name) != e.api.end())
          << e.name << ": mixed sample " << m.name << " is not one of the entry's api functions";
    }
  std::set<std::string> need;
  for (const auto& [name, n] : declared)
    if (!exempt.count(name)) need.insert(name);
  EXPECT_EQ(missing(need, in_table), "")
      << "op API functions of several tensors without a mixed-device sample";
}

// Each autograd function has a gradcheck sample in its entry named after it (the function's name,
// or the name followed by '_'), or a stated exemption.
TEST(OpTable, EveryAutogradFunctionHasAGradcheckSample) {
  const std::set<std::string> declared = autograd_functions(read("autograd/functions.h"));
  ASSERT_GE(declared.size(), 30u) << "the parse of autograd/functions.h found too little";
  ASSERT_TRUE(declared.count("add_layernorm") && declared.count("split"));
  const std::set<std::string> in_table = listed(&OpInfo::functions);
  EXPECT_EQ(missing(declared, in_table), "")
      << "autograd functions without an op table entry (tests/support/op_table*.cpp)";
  EXPECT_EQ(missing(in_table, declared), "") << "entries name autograd functions that do not exist";
  for (const OpInfo& e : op_table())
    for (const std::string& f : e.functions) {
      bool found = false;
      for (const GradSample& s : e.gradcheck)
        found = found || s.name == f || s.name.rfind(f + "_", 0) == 0;
      for (const auto& [name, reason] : e.gradcheck_exempt)
        found = found || (name == f && !reason.empty());
      EXPECT_TRUE(found) << e.name << ": no gradcheck sample named " << f << " or " << f
                         << "_..., and no exemption with a reason";
    }
}

TEST(OpTable, EntriesAreWellFormed) {
  std::set<std::string> names, samples;
  std::map<int, std::string> families;
  for (const OpInfo& e : op_table()) {
    SCOPED_TRACE(e.name);
    EXPECT_TRUE(std::regex_match(e.name, std::regex("[a-z0-9_]+")));
    EXPECT_TRUE(names.insert(e.name).second) << "two entries named " << e.name;
    EXPECT_FALSE(e.dtypes.empty());
    for (DType dt : e.dtypes) EXPECT_TRUE(is_floating(dt)) << dtype_name(dt);
    for (const GradSample& s : e.gradcheck) {
      EXPECT_TRUE(std::regex_match(s.name, std::regex("[A-Za-z0-9_]+"))) << s.name;
      EXPECT_TRUE(samples.insert(s.name).second) << "two gradcheck samples named " << s.name;
      EXPECT_FALSE(s.inputs.empty()) << s.name;
    }
    // An op with a Backend method runs on every backend: CUDA against the CPU in some form.
    if (!e.backend.empty())
      EXPECT_TRUE(e.cuda || e.empty || e.random.draw) << "no CPU-vs-CUDA samples";
    if (e.random.draw) {
      EXPECT_GE(e.random.family, 0);
      EXPECT_TRUE(families.emplace(e.random.family, e.name).second)
          << "random family " << e.random.family << " also in " << families[e.random.family];
    }
    for (const LowpSample& s : e.lowp) EXPECT_FALSE(s.outs.empty()) << s.name;
  }
}

// The parsers must see a declaration that the table lacks: the check can fail.
TEST(OpTable, TheCheckFindsAnOpWithoutAnEntry) {
  const std::string backend =
      "class Backend {\n  virtual void matmul(const Tensor& a) = 0;\n"
      "  virtual void new_op(const Tensor& x,\n                      Tensor& out) = 0;\n"
      "  virtual std::vector<double> new_many(const std::vector<Tensor>& xs) {\n";
  EXPECT_EQ(missing(backend_methods(backend), {"matmul"}), "new_many, new_op");
  const std::string api =
      "Tensor add(const Tensor& a, const Tensor& b);\ninline Tensor gelu(const Tensor& x) {\n"
      "struct R {\n  Tensor values;\n  Tensor f(int);\n};\nstd::pair<Tensor, Tensor> "
      "pair_op(int);\n"
      "// ---- comparisons (tests) ----\nbool allclose(const Tensor& a);\n";
  EXPECT_EQ(missing(api_functions(api), {"add"}), "gelu, pair_op");
  const std::string fns =
      "Variable add(const Variable& a);\nstd::pair<Variable, Variable> two(int);\n"
      "  Variable member(int);\nstd::vector<Variable> split(const Variable& x);\n";
  EXPECT_EQ(missing(autograd_functions(fns), {"add"}), "split, two");
  const std::string multi =
      "Tensor add(const Tensor& a, const Tensor& b);\nTensor gelu(const Tensor& x);\n"
      "Tensor cat(const std::vector<Tensor>& xs, int dim);\nvoid out_(const Tensor& a,\n"
      "          Tensor& out, float alpha);\n";
  const std::map<std::string, int> want{{"add", 2}, {"cat", 2}, {"out_", 2}};
  EXPECT_EQ(multi_tensor_api_functions(multi), want);
}

}  // namespace
}  // namespace strata::testing
