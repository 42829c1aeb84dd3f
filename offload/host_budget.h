#pragma once
// The host-memory budget: a ceiling on the host bytes (tiers host and pinned) a process may hold,
// checked before every allocation of the host and pinned allocators, so that a run too large for
// the machine stops with an error naming what grew too large instead of being ended by the
// kernel's OOM killer.
//
// Note [Host memory budget]
// The budget is process-wide (one per rank) and off until someone sets it (`train` sets it from
// run.host_memory_budget: "auto" is the machine's MemAvailable at start, shared by the ranks
// that run on the node). Before an allocation of `bytes` charged to a category, the allocator
// asks `check`: when the live host + pinned bytes its MemoryStats counts, plus `bytes`, would
// exceed the limit, it raises a strata::user_error naming the category being allocated, the
// bytes asked for, the budget and where it came from, and the live bytes per category. The
// check counts the bytes MemoryStats counts (what the allocators were asked for); memory outside
// the allocators (the data loader's shard index, the C++ runtime) is not counted, which is why
// "auto" is what the machine has free and not its total. A host allocator's cache of freed
// blocks (Note [Host block cache]) is real memory too: when the cache would push the process
// past the budget, it is released before the check (HostAllocator::allocate).
#include <cstdint>
#include <string>
#include <string_view>

#include "offload/memory_stats.h"

namespace strata::offload {

class HostMemoryBudget {
 public:
  // 0 = no budget.
  static int64_t limit();
  // Where the limit came from, for the error ("run.host_memory_budget = auto in x.yaml").
  static std::string source();
  static void set(int64_t limit_bytes, std::string source);

  // Note [Host memory budget]: strata::user_error when `bytes` more of `category` on top of the
  // host + pinned bytes `stats` counts would exceed the limit.
  static void check(const MemoryStats& stats, Category category, int64_t bytes);
  // The live host + pinned bytes of `stats`.
  static int64_t in_use(const MemoryStats& stats);
};

// Sets the budget for its lifetime and restores the one before (a Trainer, a test).
class HostBudgetScope {
 public:
  HostBudgetScope(int64_t limit_bytes, std::string source);
  ~HostBudgetScope();
  HostBudgetScope(const HostBudgetScope&) = delete;
  HostBudgetScope& operator=(const HostBudgetScope&) = delete;

 private:
  int64_t saved_limit_;
  std::string saved_source_;
};

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
int64_t available_host_memory();

// Note [Auto budget reserve]
// What run.host_memory_budget auto gives the allocators: MemAvailable less a reserve for the
// memory a process uses outside them (the runtime and its libraries, glibc's heap, the data
// loader's index and mapped shards, thread stacks) and for the kernel's own estimate being an
// estimate: max(1 GiB, MemAvailable / 16). Without it a run whose allocators stay just under
// MemAvailable is ended by the OOM killer instead of the budget's error (tools/tables.sh found
// a 30-block in-memory GPT-2 and a 29-block ZeRO-Inf-CPU one killed, status 137, at a budget of
// MemAvailable on the 23.5 GiB VM).
int64_t auto_host_budget_reserve(int64_t available);
// available_host_memory() less auto_host_budget_reserve(); 0 when that leaves nothing.
int64_t auto_host_budget();

// "auto" -> -1; "none" -> 0; "1073741824", "512MiB", "20GiB", "1.5TiB", "64GB": bytes (binary
// KiB..TiB, decimal KB..TB, a bare number is bytes, DeepSpeed's convention for sizes).
// strata::user_error (prefixed by `key` unless empty) for anything else, or for under 1 MiB.
int64_t parse_host_budget(std::string_view text, std::string_view key);

// What a category's bytes are, in words for errors: "activations", "optimizer states".
std::string_view category_words(Category c);

}  // namespace strata::offload
