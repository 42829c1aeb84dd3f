#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Dir {
  Dir() {
    std::string t = (fs::temp_directory_path() / "strata_atomic_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~Dir() { fs::remove_all(path); }
  std::string path;
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(AtomicFile, CommitReplacesTheFileWhole) {
  Dir d;
  std::string p = d.path + "/f.bin";
  write_file_atomically(p, "old");
  {
    AtomicFile f(p);
    f.write("new ");
    f.write(std::string(10000, 'x'));
    EXPECT_EQ(slurp(p), "old") << "the target must not change before commit";
    EXPECT_TRUE(fs::exists(f.temporary_path()));
    f.commit();
  }
  EXPECT_EQ(slurp(p), "new " + std::string(10000, 'x'));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1);
}

TEST(AtomicFile, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
  Dir d;
  std::string p = d.path + "/f.bin";
  write_file_atomically(p, "old");
  try {
    AtomicFile f(p);
    f.write("half");
    throw std::runtime_error("failure between write and commit");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1);
}

TEST(AtomicFile, MissingDirectoryIsAUserErrorNamingThePath) {
  Dir d;
  std::string p = d.path + "/no/such/dir/f.bin";
  try {
    write_file_atomically(p, "x");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(d.path + "/no/such/dir/f.bin"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata
