#pragma once
// What the CUDA emulator counts for bench_gpt2_cuda (zeros and empty lists on a GPU): whether the
// device does any work (Note [Emulator dry run]), the launches, matmuls, graph runs and idle waits
// since the process started, and every kernel launch by the place it is written (Note [Launch
// sites] in cuda_emu/control.h), with the table --launches prints from them.
#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

// Note [Emulator dry run]: the device does no work; steps time the host alone.
bool dry_run();

// What the emulator counts (zeros on a GPU): totals since the process started.
struct DeviceCounts {
  uint64_t launches = 0, matmuls = 0, graph_runs = 0, idle_waits = 0;
};

DeviceCounts device_counts();

// Note [Launch sites] (cuda_emu/control.h): the emulator's count of every kernel launch
// by where it is written, with its grid; empty on a GPU.
struct SiteRow {
  std::string kernel, where;
  uint64_t launches = 0, blocks = 0, min_blocks = 0, max_blocks = 0, under_sms = 0;
  uint32_t min_threads = 0, max_threads = 0;
};

void reset_sites();
std::vector<SiteRow> read_sites();

// --launches: a step's kernel launches by site (Note [Launch sites]), those that leave
// multiprocessors idle first; `sites` are the totals over `steps` timed steps of `name` at
// micro-batch `batch`, `seq_len` tokens, in `dtype`.
void print_launches(const std::string& name, std::vector<SiteRow> sites, int64_t batch,
                    int64_t seq_len, const std::string& dtype, int steps);

}  // namespace strata::bench
