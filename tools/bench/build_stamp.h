#pragma once
// The commit a benchmark binary was built from, so that its output says which code it measured
// (a stale build directory once passed for main's build in an A/B comparison). Generated at
// every build by tools/bench/build_stamp.cmake: `git describe --always --dirty` of the source
// tree, "-dirty" when it had uncommitted changes.
namespace strata::bench {

const char* build_commit();

}  // namespace strata::bench
