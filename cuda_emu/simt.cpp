// The SIMT engine (Note [CUDA emulator] in simt.h): launch validation, blocks run in sequence,
// the threads of a block as cooperatively scheduled fibers, block barriers and warp collectives.
#include "cuda_emu/simt.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/fiber.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {

uint3 g_thread_idx;
uint3 g_block_idx;
uint3 g_block_dim;
uint3 g_grid_dim;

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kWarp = 32;
constexpr int kMaxWarps = kMaxThreads / kWarp;

enum class State : uint8_t { Ready, Running, AtBarrier, AtWarp, Exited };

struct Thread {
  FiberContext ctx;
  uint3 tid;
  State state = State::Ready;
  // At a warp collective: what this lane passed, and its result once the collective completes.
  WarpOp op = WarpOp::SyncWarp;
  unsigned mask = 0;
  int arg = 0;
  int width = kWarp;
  uint64_t in = 0;
  uint64_t out = 0;
  // At a block barrier.
  int bar_value = 0;
  int bar_result = 0;
};

// The block being run. Everything here is used by one host thread at a time (DeviceOp holds the
// device mutex for the whole launch).
struct Block {
  const LaunchConfig* config = nullptr;
  void (*body)(void*) = nullptr;
  void* closure = nullptr;
  int n = 0;  // threads
  int current = 0;
  int exited = 0;
  int at_barrier = 0;
  BlockOp bar_op = BlockOp::Sync;
  unsigned warp_waiting[kMaxWarps] = {};
  unsigned warp_exited[kMaxWarps] = {};
  int ready[kMaxThreads] = {};  // FIFO ring of ready thread indices
  int ready_head = 0;
  int ready_count = 0;
  FiberContext scheduler;
};

Thread g_threads[kMaxThreads];
Block g_block;
bool g_in_kernel = false;
std::vector<std::unique_ptr<FiberStack>> g_stacks;
Stats g_stats;

uint3 u3(unsigned x, unsigned y, unsigned z) {
  uint3 r;
  r.x = x;
  r.y = y;
  r.z = z;
  return r;
}

size_t stack_bytes() {
  static const size_t b = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_STACK_KIB");
    const long kib = v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : 128;
    return static_cast<size_t>(kib > 16 ? kib : 16) << 10;
  }();
  return b;
}

BlockOrder initial_order() {
  const char* v = std::getenv("STRATA_CUDA_EMU_BLOCK_ORDER");
  if (v != nullptr && std::strcmp(v, "reverse") == 0) return BlockOrder::Reverse;
  if (v != nullptr && std::strcmp(v, "shuffle") == 0) return BlockOrder::Shuffle;
  return BlockOrder::Forward;
}
BlockOrder g_order = initial_order();

// BlockOrder::Shuffle (control.h): the launches counted so far and the seed they draw from.
uint64_t g_shuffle_launches = 0;
uint64_t shuffle_seed() {
  static const uint64_t seed = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_SEED");
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : uint64_t{1};
  }();
  return seed;
}
uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// STRATA_CUDA_EMU_THREAD_ORDER=reverse: the threads of a block start, and wake from barriers and
// warp collectives, from the highest index down. A missing __syncthreads between one thread's
// shared-memory write and another's read shows in one of the two orders: forward, when the
// reader has the lower index; reverse, when it has the higher one.
BlockOrder initial_thread_order() {
  const char* v = std::getenv("STRATA_CUDA_EMU_THREAD_ORDER");
  return v != nullptr && std::strcmp(v, "reverse") == 0 ? BlockOrder::Reverse : BlockOrder::Forward;
}
BlockOrder g_thread_order = initial_thread_order();
BlockOrder g_running_thread_order = BlockOrder::Forward;  // the running launch's

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::ShflIdx:
      return "__shfl_sync";
    case WarpOp::ShflUp:
      return "__shfl_up_sync";
    case WarpOp::ShflDown:
      return "__shfl_down_sync";
    case WarpOp::ShflXor:
      return "__shfl_xor_sync";
    case WarpOp::Ballot:
      return "__ballot_sync";
    default:
      return "__syncwarp";
  }
}

const char* barrier_name(BlockOp op) {
  switch (op) {
    case BlockOp::Count:
      return "__syncthreads_count";
    case BlockOp::And:
      return "__syncthreads_and";
    case BlockOp::Or:
      return "__syncthreads_or";
    default:
      return "__syncthreads";
  }
}

std::string where() {
  const LaunchConfig& c = *g_block.config;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "kernel %s (launched at %s:%d), block (%u,%u,%u) of (%u,%u,%u)",
                c.kernel, c.file, c.line, g_block_idx.x, g_block_idx.y, g_block_idx.z, c.grid.x,
                c.grid.y, c.grid.z);
  return buf;
}

std::string thread_name(int i) {
  const uint3 t = g_threads[i].tid;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "thread (%u,%u,%u) [warp %d lane %d]", t.x, t.y, t.z, i / kWarp,
                i % kWarp);
  return buf;
}

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "strata CUDA emulator: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] void fail_here(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fail(where() + ", " + thread_name(g_block.current) + ": " + buf);
}

std::string lanes(unsigned m) {
  std::string s;
  for (int l = 0; l < kWarp; ++l) {
    if (!(m >> l & 1u)) continue;
    int e = l;
    while (e + 1 < kWarp && (m >> (e + 1) & 1u)) ++e;
    if (!s.empty()) s += ",";
    s += e == l ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e);
    l = e;
  }
  return s.empty() ? "none" : s;
}

std::string state_of(int i) {
  const Thread& t = g_threads[i];
  char buf[128];
  switch (t.state) {
    case State::AtBarrier:
      return barrier_name(g_block.bar_op);
    case State::AtWarp:
      std::snprintf(buf, sizeof(buf), "%s(mask 0x%08x)", op_name(t.op), t.mask);
      return buf;
    case State::Exited:
      return "exited";
    default:
      return "running";
  }
}

// Every waiting thread and what it waits for: the body of a deadlock report.
std::string waiting_report() {
  std::string r;
  if (g_block.at_barrier > 0) {
    r += "\n  " + std::to_string(g_block.at_barrier) + " of " + std::to_string(g_block.n) +
         " threads wait at " + barrier_name(g_block.bar_op);
  }
  for (int w = 0; w * kWarp < g_block.n; ++w) {
    const unsigned waiting = g_block.warp_waiting[w];
    if (waiting == 0) continue;
    unsigned done = 0;
    for (int l = 0; l < kWarp; ++l) {
      if (!(waiting >> l & 1u) || (done >> l & 1u)) continue;
      const Thread& t = g_threads[w * kWarp + l];
      unsigned same = 0;
      for (int k = l; k < kWarp; ++k) {
        const Thread& u = g_threads[w * kWarp + k];
        if ((waiting >> k & 1u) && u.op == t.op && u.mask == t.mask) same |= 1u << k;
      }
      done |= same;
      r += "\n  warp " + std::to_string(w) + " lanes " + lanes(same) + " wait at " + op_name(t.op);
      char m[32];
      std::snprintf(m, sizeof(m), "(mask 0x%08x)", t.mask);
      r += m;
      const unsigned missing = t.mask & ~waiting;
      for (int k = 0; k < kWarp; ++k)
        if (missing >> k & 1u)
          r += "; lane " + std::to_string(k) + " is at " + state_of(w * kWarp + k);
    }
  }
  if (g_block.exited > 0) r += "\n  " + std::to_string(g_block.exited) + " threads have exited";
  return r;
}

void make_ready(int i) {
  g_threads[i].state = State::Ready;
  g_block.ready[(g_block.ready_head + g_block.ready_count) % kMaxThreads] = i;
  ++g_block.ready_count;
}

// Leaves the current (waiting or exited) thread for the next ready one, or for the scheduler when
// every thread has exited. Returns when the current thread is switched back to.
void switch_away(Thread& me) {
  if (g_block.ready_count == 0) {
    if (g_block.exited == g_block.n) {
      fiber_switch(me.ctx, g_block.scheduler);
      return;  // not reached: an exited thread is never resumed
    }
    fail(where() + ": deadlock, no thread can proceed:" + waiting_report());
  }
  const int j = g_block.ready[g_block.ready_head];
  g_block.ready_head = (g_block.ready_head + 1) % kMaxThreads;
  --g_block.ready_count;
  Thread& next = g_threads[j];
  next.state = State::Running;
  g_block.current = j;
  g_thread_idx = next.tid;
  ++g_stats.switches;
  fiber_switch(me.ctx, next.ctx);
}

void thread_exit(int i) {
  Thread& me = g_threads[i];
  me.state = State::Exited;
  ++g_block.exited;
  const int w = i / kWarp, lane = i % kWarp;
  g_block.warp_exited[w] |= 1u << lane;
  if (g_block.at_barrier > 0)
    fail_here(
        "exited while %d other threads wait for it at %s (every thread of the block must "
        "reach a __syncthreads, or none)",
        g_block.at_barrier, barrier_name(g_block.bar_op));
  const unsigned waiting = g_block.warp_waiting[w];
  for (int l = 0; l < kWarp; ++l) {
    const Thread& t = g_threads[w * kWarp + l];
    if ((waiting >> l & 1u) && (t.mask >> lane & 1u))
      fail_here("exited while lane %d waits for it at %s(mask 0x%08x)", l, op_name(t.op), t.mask);
  }
  switch_away(me);
}

void thread_main(void* arg) noexcept {
  Thread* t = static_cast<Thread*>(arg);
  g_block.body(g_block.closure);
  thread_exit(static_cast<int>(t - g_threads));
}

bool describe_fault(const void* addr, char* buf, size_t n) {
  const uint3 t = g_threads[g_block.current].tid;
  std::snprintf(buf, n, "kernel %s (launched at %s:%d), block (%u,%u,%u) thread (%u,%u,%u)",
                g_block.config->kernel, g_block.config->file, g_block.config->line, g_block_idx.x,
                g_block_idx.y, g_block_idx.z, t.x, t.y, t.z);
  return g_block.current < static_cast<int>(g_stacks.size()) &&
         g_stacks[g_block.current]->in_guard(addr);
}

void run_block(uint3 block_idx) {
  g_block_idx = block_idx;
  const uint3 bd = g_block_dim;
  const int n = g_block.n;
  for (int i = 0; i < n; ++i) {
    Thread& t = g_threads[i];
    t.tid = u3(i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y));
    t.state = State::Ready;
    fiber_init(t.ctx, *g_stacks[i], &thread_main, &t, static_cast<size_t>(i % 64) * 64);
  }
  g_block.exited = 0;
  g_block.at_barrier = 0;
  for (int w = 0; w < kMaxWarps; ++w) g_block.warp_waiting[w] = g_block.warp_exited[w] = 0;
  g_block.ready_head = 0;
  g_block.ready_count = 0;
  const bool reverse = g_running_thread_order == BlockOrder::Reverse;
  const int first = reverse ? n - 1 : 0;
  for (int k = 1; k < n; ++k) make_ready(reverse ? n - 1 - k : k);
  g_block.current = first;
  g_threads[first].state = State::Running;
  g_thread_idx = g_threads[first].tid;
  ++g_stats.blocks;
  g_stats.threads += static_cast<uint64_t>(n);
  fiber_switch(g_block.scheduler, g_threads[first].ctx);
}

cudaError_t validate(const LaunchConfig& c) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (c.block.x == 0 || c.block.y == 0 || c.block.z == 0 || c.grid.x == 0 || c.grid.y == 0 ||
      c.grid.z == 0)
    return cudaErrorInvalidConfiguration;
  if (c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64 || threads > kMaxThreads)
    return cudaErrorInvalidConfiguration;
  if (c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535)
    return cudaErrorInvalidConfiguration;
  return cudaSuccess;
}

Thread& current_thread(const char* what) {
  if (!g_in_kernel) fail(std::string(what) + " called outside a kernel");
  return g_threads[g_block.current];
}

}  // namespace

namespace {

void run_launch(const LaunchConfig& config, KernelJob& job, BlockOrder order,
                BlockOrder thread_order) {
  if (dry_run()) {  // Note [Emulator dry run]
    ++g_stats.launches;
    return;
  }
  DeviceOp op(config.kernel);
  g_running_thread_order = thread_order;
  DeviceMemory::get().open_pointed_to(job.params, job.params_bytes);
  const int n = static_cast<int>(config.block.x * config.block.y * config.block.z);
  while (static_cast<int>(g_stacks.size()) < n)
    g_stacks.push_back(std::make_unique<FiberStack>(stack_bytes()));

  g_block.config = &config;
  g_block.body = [](void* j) { static_cast<KernelJob*>(j)->run_thread(); };
  g_block.closure = &job;
  g_block.n = n;
  g_block_dim = u3(config.block.x, config.block.y, config.block.z);
  g_grid_dim = u3(config.grid.x, config.grid.y, config.grid.z);
  g_in_kernel = true;
  set_fault_context(&describe_fault);
  ++g_stats.launches;

  const uint64_t gx = config.grid.x, gy = config.grid.y, gz = config.grid.z;
  const uint64_t blocks = gx * gy * gz;
  // Shuffle: k -> (a k + c) mod blocks, a permutation when gcd(a, blocks) = 1.
  uint64_t a = 1, c = 0;
  if (order == BlockOrder::Shuffle && blocks > 1) {
    const uint64_t r = mix64(shuffle_seed() * 0x9E3779B97F4A7C15ull + ++g_shuffle_launches);
    c = r % blocks;
    a = 1 + (r >> 32) % (blocks - 1);
    while (std::gcd(a, blocks) != 1) a = a % (blocks - 1) + 1;
  }
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t b =
        order == BlockOrder::Reverse ? blocks - 1 - k
        : order == BlockOrder::Shuffle
            ? static_cast<uint64_t>((static_cast<unsigned __int128>(a) * k + c) % blocks)
            : k;
    run_block(u3(static_cast<unsigned>(b % gx), static_cast<unsigned>((b / gx) % gy),
                 static_cast<unsigned>(b / (gx * gy))));
  }
  set_fault_context(nullptr);
  g_in_kernel = false;
}

}  // namespace

void launch(const LaunchConfig& config, std::shared_ptr<KernelJob> job) {
#if defined(STRATA_CUDA_EMU_CONTRACTS)
  // Note [Emulated FMA contraction]: the kernels were compiled with -mfma.
  static const bool host_fma = __builtin_cpu_supports("fma");
  if (!host_fma)
    fail(std::string("kernel ") + config.kernel +
         ": this emulation build contracts FMAs (-mfma) and this CPU has no FMA; reconfigure "
         "with -DSTRATA_CUDA_EMU_FMA_CONTRACT=OFF");
#endif
  if (g_in_kernel)
    fail(where() + ": launches kernel " + config.kernel +
         " from device code (dynamic parallelism is not emulated)");
  const cudaError_t bad = validate(config);
  if (bad != cudaSuccess) return record_error(bad);
  if (!valid_stream(config.stream)) return record_error(cudaErrorInvalidResourceHandle);
  count_launch_site(config);
  if (config.shared_bytes > 0)
    fail(std::string("kernel ") + config.kernel + " asks for " +
         std::to_string(config.shared_bytes) +
         " bytes of dynamic shared memory, which the emulator does not provide (Strata's "
         "kernels use static __shared__ arrays)");
  // The orders in force at the launch, which is when the program chose them.
  enqueue(config.stream, [config, job = std::move(job), order = g_order, threads = g_thread_order] {
    run_launch(config, *job, order, threads);
  });
}

int block_barrier(BlockOp op, int value) {
  Thread& me = current_thread(barrier_name(op));
  if (g_block.exited > 0)
    fail_here(
        "reached %s after %d threads of the block exited (every thread of the block must "
        "reach a __syncthreads, or none)",
        barrier_name(op), g_block.exited);
  if (g_block.at_barrier > 0 && g_block.bar_op != op)
    fail_here("waits at %s while %d threads wait at %s", barrier_name(op), g_block.at_barrier,
              barrier_name(g_block.bar_op));
  me.state = State::AtBarrier;
  me.bar_value = value;
  g_block.bar_op = op;
  if (++g_block.at_barrier < g_block.n) {
    switch_away(me);
    return me.bar_result;
  }
  int count = 0;
  for (int i = 0; i < g_block.n; ++i) count += g_threads[i].bar_value != 0;
  const int result = op == BlockOp::Count ? count
                     : op == BlockOp::And ? count == g_block.n
                     : op == BlockOp::Or  ? count > 0
                                          : 0;
  g_block.at_barrier = 0;
  const int self = static_cast<int>(&me - g_threads);
  const bool reverse = g_running_thread_order == BlockOrder::Reverse;
  for (int k = 0; k < g_block.n; ++k) {
    const int i = reverse ? g_block.n - 1 - k : k;
    g_threads[i].bar_result = result;
    if (i != self) make_ready(i);
  }
  me.state = State::Running;
  return result;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Thread& me = current_thread(op_name(op));
  const int self = static_cast<int>(&me - g_threads);
  const int w = self / kWarp, lane = self % kWarp;
  const int warp_lanes = std::min(kWarp, g_block.n - w * kWarp);
  const unsigned exists = warp_lanes == kWarp ? ~0u : (1u << warp_lanes) - 1u;
  if (!(mask >> lane & 1u))
    fail_here("calls %s with mask 0x%08x, which does not name the calling lane %d", op_name(op),
              mask, lane);
  if (mask & ~exists)
    fail_here("%s(mask 0x%08x) names lanes %s, which do not exist (the block has %d threads)",
              op_name(op), mask, lanes(mask & ~exists).c_str(), g_block.n);
  if (mask & g_block.warp_exited[w])
    fail_here("%s(mask 0x%08x) names lanes %s, which have exited", op_name(op), mask,
              lanes(mask & g_block.warp_exited[w]).c_str());
  if (width < 1 || width > kWarp || (width & (width - 1)) != 0)
    fail_here("%s with width %d (a power of two up to 32)", op_name(op), width);
  me.state = State::AtWarp;
  me.op = op;
  me.mask = mask;
  me.arg = arg;
  me.width = width;
  me.in = value;
  g_block.warp_waiting[w] |= 1u << lane;
  if ((g_block.warp_waiting[w] & mask) != mask) {
    switch_away(me);
    return me.out;
  }
  // Every lane in the mask is here: they must agree on the collective, then each gets its value.
  Thread* warp = g_threads + w * kWarp;
  for (int l = 0; l < kWarp; ++l) {
    if (!(mask >> l & 1u)) continue;
    const Thread& t = warp[l];
    if (t.op != op || t.mask != mask || t.width != width)
      fail_here("%s(mask 0x%08x, width %d) meets lane %d at %s(mask 0x%08x, width %d)", op_name(op),
                mask, width, l, op_name(t.op), t.mask, t.width);
  }
  unsigned ballot = 0;
  for (int l = 0; l < kWarp; ++l)
    if ((mask >> l & 1u) && warp[l].in != 0) ballot |= 1u << l;
  for (int l = 0; l < kWarp; ++l) {
    if (!(mask >> l & 1u)) continue;
    Thread& t = warp[l];
    const int seg = l / width * width;
    int src = l;
    switch (op) {
      case WarpOp::ShflIdx:
        src = seg + ((t.arg % width) + width) % width;
        break;
      case WarpOp::ShflUp:
        src = l - t.arg >= seg ? l - t.arg : l;
        break;
      case WarpOp::ShflDown:
        src = l + t.arg < seg + width ? l + t.arg : l;
        break;
      case WarpOp::ShflXor:
        src = l ^ t.arg;
        if (src < 0 || src >= seg + width) src = l;  // a later group: the lane's own value
        break;
      default:
        break;
    }
    if (op == WarpOp::Ballot)
      t.out = ballot;
    else if (op == WarpOp::SyncWarp)
      t.out = 0;
    else
      t.out = (mask >> src & 1u) ? warp[src].in : ~uint64_t{0};  // undefined read: all ones
  }
  g_block.warp_waiting[w] &= ~mask;
  for (int k = 0; k < kWarp; ++k) {
    const int l = g_running_thread_order == BlockOrder::Reverse ? kWarp - 1 - k : k;
    if ((mask >> l & 1u) && l != lane) make_ready(w * kWarp + l);
  }
  me.state = State::Running;
  return me.out;
}

unsigned active_mask() {
  Thread& me = current_thread("__activemask");
  const int w = static_cast<int>(&me - g_threads) / kWarp;
  const int warp_lanes = std::min(kWarp, g_block.n - w * kWarp);
  const unsigned exists = warp_lanes == kWarp ? ~0u : (1u << warp_lanes) - 1u;
  return exists & ~g_block.warp_exited[w];
}

void set_thread_order(BlockOrder order) {
  g_thread_order = order;
}

void set_block_order(BlockOrder order) {
  g_order = order;
}

BlockOrder block_order() {
  return g_order;
}

void count_matmul() {
  ++g_stats.matmuls;
}

void count_graph_run() {
  ++g_stats.graph_runs;
}

bool dry_run() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_DRY_RUN");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

Stats stats() {
  Stats s = g_stats;
  s.host_waits = host_waits();
  s.idle_waits = idle_waits();
  DeviceMemory& m = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(m.mutex());
  s.device_allocations = m.count();
  s.device_bytes = m.used();
  return s;
}

}  // namespace strata::cuda_emu
