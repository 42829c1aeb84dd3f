// The CUDA kernels as nvcc compiles them (PTX for each architecture of STRATA_CUDA_ARCHS, built by
// the strata_kernels_ptx_sm* targets in tests/CMakeLists.txt), checked without a GPU: every kernel
// is named in the table below, the kernels meant to move 128-bit words (Note [CUDA element groups]
// in tensor/cuda/common.cuh, and the row kernels' packs) have 128-bit global loads and stores in
// their code, no kernel but the normal draw keeps a stack frame in local memory, none adds floats
// atomically (determinism), and ptxas spills no kernel's registers. PTX is what ptxas turns into
// the GPU's code: a vector access there becomes one 128-bit LDG/STG instruction.
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Kernel {
  std::string name;  // demangled, without return type and strata:: qualifiers
  std::string file;
  int wide_loads = 0, wide_stores = 0;
  int float_atomics = 0;  // atom.* / red.* on a floating-point type
  bool local_memory = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  std::string s = status == 0 && d ? std::string(d.get()) : mangled;
  s = std::regex_replace(
      s, std::regex(R"(strata::[a-z_]+::(?:[a-z_]+::)*(?:\(anonymous namespace\)::)?)"), "");
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  return s;
}

// Bits moved by one ld.global / st.global instruction, e.g. ld.global.nc.v4.u32 -> 128.
int access_bits(const std::string& op) {
  int vec = 1, bits = 0;
  std::stringstream ss(op);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (part == "v2" || part == "v4" || part == "v8") vec = part[1] - '0';
    static const std::regex type(R"([busf](8|16|32|64))");
    std::smatch m;
    if (std::regex_match(part, m, type)) bits = std::stoi(m[1]);
  }
  return vec * bits;
}

// Every .entry of one PTX file, with its body (the braces after the parameter list).
std::vector<Kernel> parse_ptx(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<Kernel> out;
  static const std::regex entry(
      R"((?:^|\n)[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z0-9_$]+)\()");
  static const std::regex access(R"(\b(ld|st)\.global[.\w:]*)");
  static const std::regex atomic(R"(\b(atom|red)\.[.\w:]*)");
  static const std::regex float_type(R"(\.(b?f16(x2)?|f32|f64)\b)");
  for (std::sregex_iterator it(text.begin(), text.end(), entry), end; it != end; ++it) {
    Kernel k;
    k.name = demangle((*it)[1]);
    k.file = path.substr(path.find_last_of('/') + 1);
    const size_t open = text.find('{', static_cast<size_t>(it->position() + it->length()));
    if (open == std::string::npos) break;
    size_t close = open;
    for (int depth = 0; close < text.size(); ++close) {
      if (text[close] == '{') ++depth;
      if (text[close] == '}' && --depth == 0) break;
    }
    const std::string body = text.substr(open, close - open);
    k.local_memory = body.find("__local_depot") != std::string::npos;
    for (std::sregex_iterator a(body.begin(), body.end(), atomic), e; a != e; ++a)
      if (std::regex_search(a->str(), float_type)) ++k.float_atomics;
    for (std::sregex_iterator a(body.begin(), body.end(), access), e; a != e; ++a) {
      if (access_bits(a->str()) < 128) continue;
      ((*a)[1] == "ld" ? k.wide_loads : k.wide_stores)++;
    }
    out.push_back(k);
  }
  return out;
}

// Every kernel of every PTX file the build lists; none at all fails the calling test.
std::vector<Kernel> all_kernels() {
  std::vector<Kernel> all;
  std::ifstream list(STRATA_PTX_LIST);
  EXPECT_TRUE(list.is_open()) << STRATA_PTX_LIST;
  std::string path;
  while (std::getline(list, path)) {
    if (path.empty()) continue;
    std::vector<Kernel> ks = parse_ptx(path);
    EXPECT_FALSE(ks.empty()) << path << ": no kernels";
    all.insert(all.end(), ks.begin(), ks.end());
  }
  EXPECT_FALSE(all.empty()) << "no PTX kernels listed in " << STRATA_PTX_LIST;
  return all;
}

// The PTX files name their architecture in `.target sm_XX`; ptxas is run for it.
std::string ptx_target(const std::string& path) {
  static const std::regex target(R"(\n\.target[ \t]+(sm_[0-9]+a?))");
  const std::string text = read_file(path);
  std::smatch m;
  return std::regex_search(text, m, target) ? m[1].str() : std::string();
}

// One PTX file per kernel source and architecture (STRATA_CUDA_ARCHS): how many architectures.
int ptx_files_per_kernel_file() {
  std::ifstream list(STRATA_PTX_LIST);
  std::map<std::string, int> per_name;
  std::string path;
  while (std::getline(list, path))
    if (!path.empty()) ++per_name[path.substr(path.find_last_of('/') + 1)];
  return per_name.empty() ? 0 : per_name.begin()->second;
}

// What a kernel's code must hold: 128-bit loads (L), stores (S), both, or nothing (a kernel that
// moves one element at a time by design: strided views, a scalar fallback instantiation, small
// reductions, index sorting). The first rule whose pattern matches the start of the name applies.
enum Need { kNone = 0, kLoads = 1, kStores = 2, kBoth = 3 };
struct Rule {
  const char* pattern;
  Need need;
  const char* why;
};
const Rule kRules[] = {
    // Contiguous elementwise kernels: groups or packs of 128 bits, a scalar tail.
    {R"(map1_kernel<)", kBoth, "elementwise"},
    {R"(map2_kernel<)", kBoth, "elementwise"},
    {R"(axpy_kernel<)", kBoth, "elementwise, any two float dtypes"},
    {R"(bias_add_kernel<)", kBoth, "elementwise"},
    {R"(cast_contig_kernel<)", kBoth, "contiguous cast"},
    {R"(dropout_kernel<)", kBoth, "elementwise"},
    {R"((uniform|normal)_kernel<)", kStores, "random draws, a Philox block per 4 elements"},
    {R"(rotary_kernel<)", kBoth, "rotary embedding, pairs in groups"},
    {R"(fill_contig_kernel\()", kStores, "contiguous fill"},
    {R"(scale_unless_equal_kernel<)", kBoth, "gradient clipping's scale"},
    {R"(sum_squares_partial<)", kLoads, "gradient norm"},
    {R"(bias_act<)", kBoth, "linear epilogue fallback"},
    {R"(gelu_backward_f32<)", kBoth, "linear epilogue fallback"},
    {R"(gelu_backward_bias_partials<)", kBoth, "linear GELU gradient with its bias partials"},
    {R"(adamw_kernel\()", kBoth, "fused AdamW"},
    {R"(sgd_kernel\()", kBoth, "multi-tensor SGD"},
    // Column kernels: K consecutive columns per thread.
    {R"(column_partials<)", kLoads, "bias gradient (epilogue fallback); f32 partials"},
    {R"(column_sum_partials<)", kLoads, "bias gradient (sum_to); f64 partials"},
    {R"(norm_bwd_partials<)", kBoth, "norm weight gradients"},
    {R"(embedding_bwd<[^,]+, [^,]+, [248]>)", kBoth, "embedding backward, grouped columns"},
    // Row kernels: packs of a row per thread when the rows are aligned.
    {R"(add_norm_fwd<[^,]+, [48], )", kBoth, "residual + norm forward, packed"},
    {R"(add_norm_bwd<[^,]+, [48], )", kBoth, "residual + norm backward, packed"},
    {R"(add_norm_bwd_fused<[^,]+, [48], )", kBoth, "norm backward with its weight gradients"},
    {R"(softmax_fwd<[^,]+, true>)", kBoth, "softmax, packed"},
    {R"(softmax_bwd<[^,]+, true>)", kBoth, "softmax backward, packed"},
    {R"(ce_fwd<)", kLoads, "cross-entropy forward"},
    {R"(ce_bwd<)", kBoth, "cross-entropy backward"},
    {R"(ce_fused<)", kBoth, "cross-entropy forward and backward"},
    {R"(embedding_fwd\()", kBoth, "embedding rows as 16-byte words"},
    {R"(attn_fwd<[^,]+, true>)", kLoads, "own attention, packed rows"},
    {R"(attn_bwd_dq<[^,]+, true>)", kLoads, "own attention, packed rows"},
    {R"(attn_bwd_dkv<[^,]+, true>)", kLoads, "own attention, packed rows"},
    {R"(attn_fwd_tc<)", kLoads, "own tensor-core attention"},
    {R"(attn_bwd_dq_tc<)", kLoads, "own tensor-core attention"},
    {R"(attn_bwd_dkv_tc<)", kLoads, "own tensor-core attention"},
    {R"(attn_decode_part<[^,]+, [0-9]+, true>)", kLoads, "decode attention, packed key rows"},
    // One element at a time by design.
    {R"(add_norm_(fwd|bwd)<[^,]+, 1, )", kNone, "rows not 16-byte aligned"},
    {R"(add_norm_bwd_fused<[^,]+, 1, )", kNone, "rows not 16-byte aligned"},
    {R"(softmax_(fwd|bwd)<[^,]+, false>)", kNone, "rows not 16-byte aligned"},
    {R"(attn_(fwd|bwd_dq|bwd_dkv)<[^,]+, false>)", kNone, "rows not 16-byte aligned"},
    {R"(embedding_bwd<[^,]+, [^,]+, 1>)", kNone, "columns not whole 128-bit words"},
    {R"(attn_bwd_di<)", kNone, "one row sum per thread (own attention's backward)"},
    {R"(attn_decode_part<[^,]+, [0-9]+, false>)", kNone, "key rows not 16-byte aligned"},
    {R"(attn_decode_combine<)", kNone, "the runs' f32 partials, one element per lane"},
    {R"(copy_kernel\()", kNone, "strided, any two dtypes"},
    {R"(copy_same_kernel<)", kNone, "strided layout change"},
    {R"(fill_kernel\()", kNone, "strided fill"},
    {R"(arange_kernel\()", kNone, "one value per index"},
    {R"(binary_kernel<)", kNone, "broadcast / strided operands"},
    {R"(affine_kernel<)", kNone, "strided operand"},
    {R"(reduce_kernel\()", kNone, "strided reduction"},
    {R"(sum_partials\()", kNone, "rows of kSumSquaresBlocks partial sums"},
    {R"(chunk_column_sums<)", kNone, "chunk partials, c per chunk (Note [Chunk partial sums])"},
    {R"(embedding_keys\()", kNone, "one sort key per id"},
    {R"(bitonic_(tile|pass)\()", kNone, "sort network"},
    {R"(top_k_kernel<)", kNone, "a row's radix counts and its candidates' sort in shared memory"},
    {R"(top_1_kernel<)", kNone, "a row's best element, one word per thread"},
    {R"(ce_norm\()", kNone, "count of targets"},
};

const Rule* rule_for(const std::string& name) {
  for (const Rule& r : kRules)
    if (std::regex_search(name, std::regex(std::string("^") + r.pattern))) return &r;
  return nullptr;
}

TEST(KernelPtx, EveryKernelIsClassifiedAndTheWideOnesMove128BitWords) {
  const std::vector<Kernel> kernels = all_kernels();
  ASSERT_GT(kernels.size(), 100u) << "expected the PTX of every kernel file in " << STRATA_PTX_LIST;
  std::map<const Rule*, int> matched;
  for (const Kernel& k : kernels) {
    SCOPED_TRACE(k.file + ": " + k.name);
    const Rule* r = rule_for(k.name);
    ASSERT_NE(r, nullptr) << "a kernel the table in tests/ptx/ptx_test.cpp does not name: say "
                             "whether it must move 128-bit words";
    ++matched[r];
    if (r->need & kLoads) {
      EXPECT_GT(k.wide_loads, 0) << "no 128-bit global load (" << r->why << ")";
    }
    if (r->need & kStores) {
      EXPECT_GT(k.wide_stores, 0) << "no 128-bit global store (" << r->why << ")";
    }
  }
  for (const Rule& r : kRules) EXPECT_GT(matched[&r], 0) << "no kernel matches " << r.pattern;
}

// A kernel with a local-memory stack frame (an array indexed at run time, a struct whose address
// escapes, register spills in ptxas later) reads and writes it through the cache hierarchy on
// every use. Only the normal draw has one: sinf/cosf keep the seven words of their reduction of
// large arguments (Payne-Hanek, against 2/pi's bits) there, a path 2*pi*u in [0, 2*pi) never takes.
TEST(KernelPtx, NoKernelButTheNormalDrawUsesLocalMemory) {
  const std::vector<Kernel> kernels = all_kernels();
  int normal = 0;
  for (const Kernel& k : kernels) {
    if (k.name.rfind("normal_kernel<", 0) == 0) {
      ++normal;
      continue;
    }
    EXPECT_FALSE(k.local_memory) << k.file << ": " << k.name;
  }
  EXPECT_EQ(normal, 3 * ptx_files_per_kernel_file());  // f32, bf16, f16, for each architecture
}

// docs/design.md decision 9 (determinism: no order-dependent atomics in reductions): no kernel adds
// floats with atomics, whose order, and so whose rounding, varies from run to run; sums go through
// fixed trees and chunk orders instead. Integer atomics (exact in any order) are allowed.
TEST(KernelPtx, NoKernelAddsFloatsAtomically) {
  for (const Kernel& k : all_kernels()) EXPECT_EQ(k.float_atomics, 0) << k.file << ": " << k.name;
}

// ptxas (the toolkit's, as the build runs it: the PTX's architecture, -maxrregcount=64): no kernel
// spills registers to local memory or keeps a stack frame there, but the normal draw (above).
// The build prints spills as warnings (-Xptxas=-warn-spills); this makes one fail.
TEST(KernelPtx, PtxasSpillsNoRegisters) {
  std::ifstream list(STRATA_PTX_LIST);
  const std::string cubin = ::testing::TempDir() + "/strata_ptx_test.cubin";
  static const std::regex props(
      R"(Function properties for ([A-Za-z0-9_$]+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  int functions = 0, entries = 0, kernels = 0;
  std::string path;
  while (std::getline(list, path)) {
    if (path.empty()) continue;
    SCOPED_TRACE(path);
    kernels += static_cast<int>(parse_ptx(path).size());
    const std::string arch = ptx_target(path);
    ASSERT_FALSE(arch.empty()) << "no .target line";
    const std::string cmd = std::string(STRATA_PTXAS) + " -arch=" + arch +
                            " --maxrregcount=64 -v '" + path + "' -o '" + cubin + "' 2>&1";
    std::unique_ptr<FILE, decltype(&pclose)> pipe(popen(cmd.c_str(), "r"), &pclose);
    ASSERT_NE(pipe, nullptr) << cmd;
    std::string out;
    char buf[4096];
    for (size_t got; (got = fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, got);
    ASSERT_EQ(pclose(pipe.release()), 0) << cmd << "\n" << out;
    for (size_t at = 0; (at = out.find("Compiling entry function", at)) != std::string::npos; ++at)
      ++entries;
    for (std::sregex_iterator it(out.begin(), out.end(), props), end; it != end; ++it) {
      ++functions;
      const std::string name = demangle((*it)[1]);
      EXPECT_EQ(std::stoi((*it)[3]), 0) << "spill stores in " << name;
      EXPECT_EQ(std::stoi((*it)[4]), 0) << "spill loads in " << name;
      if (name.rfind("normal_kernel<", 0) != 0) {
        EXPECT_EQ(std::stoi((*it)[2]), 0) << "a stack frame in " << name;
      }
    }
  }
  std::remove(cubin.c_str());
  EXPECT_EQ(entries, kernels);  // ptxas compiled every kernel the PTX holds
  EXPECT_GE(functions, entries);
}

// The parser itself, on a hand-written PTX file: vector widths, both kinds of entry, a nested
// brace scope, and a local frame.
TEST(KernelPtx, TheParserReadsEntriesAndAccessWidths) {
  const std::string path = ::testing::TempDir() + "/strata_ptx_test.ptx";
  {
    std::ofstream f(path);
    f << ".version 8.0\n.target sm_90\n"
         ".visible .entry _Z3onePf(\n\t.param .u64 p\n)\n{\n"
         "\tld.global.nc.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];\n"
         "\t{ .reg .b32 t; st.global.v2.f64 [%rd2], {%fd1, %fd2}; }\n"
         "\tst.global.u16 [%rd3], %rs1;\n}\n"
         ".weak .entry _Z3twoPf(\n\t.param .u64 p\n)\n{\n"
         "\t.local .align 8 .b8 __local_depot1[16];\n"
         "\tatom.global.add.u32 %r5, [%rd4], 1;\n\tred.global.add.f32 [%rd4], %f1;\n"
         "\tatom.global.add.noftz.bf16x2 %r6, [%rd4], %r7;\n"
         "\tld.global.v2.f32 {%f1, %f2}, [%rd1];\n\tst.global.v4.b32 [%rd1], {%r1, %r2, %r3, "
         "%r4};\n}\n";
  }
  const std::vector<Kernel> ks = parse_ptx(path);
  EXPECT_EQ(ptx_target(path), "sm_90");
  std::remove(path.c_str());
  ASSERT_EQ(ks.size(), 2u);
  EXPECT_EQ(ks[0].name, "one(float*)");
  EXPECT_EQ(ks[0].wide_loads, 1);
  EXPECT_EQ(ks[0].wide_stores, 1);  // v2.f64: 128 bits; u16 is not
  EXPECT_FALSE(ks[0].local_memory);
  EXPECT_EQ(ks[1].name, "two(float*)");
  EXPECT_EQ(ks[1].wide_loads, 0);  // v2.f32: 64 bits
  EXPECT_EQ(ks[1].wide_stores, 1);
  EXPECT_TRUE(ks[1].local_memory);
  EXPECT_EQ(ks[0].float_atomics, 0);
  EXPECT_EQ(ks[1].float_atomics, 2);  // red .f32 and atom .bf16x2; the .u32 one is not
  EXPECT_EQ(access_bits("ld.global.nc.L1::no_allocate.v4.u32"), 128);
  EXPECT_EQ(access_bits("st.global.v8.b16"), 128);
}

}  // namespace
