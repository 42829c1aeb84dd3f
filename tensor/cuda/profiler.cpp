// Note [CUDA op profiler]
// Where a GPU step's time goes, per backend op, measured on the device. While profiling is on
// (tensor::cuda_profile_start .. cuda_profile_stop, tensor/cuda.h), each CUDA backend op (and the
// fused AdamW, through tensor::CudaProfileScope) records a CUDA event on the compute stream
// before and after the work it enqueues; the elapsed time between the two, summed per op name,
// is that op's device time. Because the events are in stream order, the time is the GPU's,
// whatever the host does meanwhile; time the device spends between ops (waiting for the host, or
// in work no scope covers: copies the host starts, NCCL) shows up as the gap between the sum of
// the ops and the step's wall time.
//   - Nesting: an op that calls another through the backend (linear's fallback calls matmul)
//     is timed once, as the outer op (a thread-local depth).
//   - Attention names the path that ran: attention_forward[cudnn], [own-tc], [own-decode] or [own].
//   - Each op also adds the FLOPs it computes (the GEMMs and attention; others 0) and the bytes
//     of its operands, so the report gives TFLOP/s for compute-bound ops and GB/s for the rest.
//   - Cost: two cudaEventRecord per op while on, one relaxed atomic load per op while off.
//     Every 4096 ops the host waits for the recorded events and folds them into the totals, so
//     a profiled run has a few more host waits than an unprofiled one (between ops, not inside
//     them).
// bench_gpt2_cuda --profile prints the table (tools/bench/bench_gpt2_cuda.cpp); on the CUDA
// emulator the times are the emulator's and mean nothing, but the calls, FLOPs and bytes do.
#include "tensor/cuda/profiler.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"

namespace strata::tensor::cuda {

void* current_stream();

namespace {

struct Entry {
  std::string op;
  cudaEvent_t start = nullptr, end = nullptr;
  double flops = 0, bytes = 0;
  bool closed = false;
};

struct Totals {
  int64_t calls = 0;
  double ms = 0, flops = 0, bytes = 0;
};

constexpr size_t kFoldEvery = 4096;

struct State {
  std::atomic<bool> on{false};
  std::mutex mu;
  int next_slot = 0;
  std::map<int, Entry> entries;  // by slot: scopes recording or closed but not yet folded
  std::vector<cudaEvent_t> pool;
  std::map<std::string, Totals> totals;
};

State& state() {
  static State* s = new State();  // lives for the process, like the backend
  return *s;
}

thread_local int t_depth = 0;

cudaEvent_t take_event(State& s) {
  if (!s.pool.empty()) {
    cudaEvent_t e = s.pool.back();
    s.pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "cudaEventCreate (profiler)");
  return e;
}

// Adds every closed entry to the totals (keep = true) or drops it, waiting for its events;
// their events go back to the pool. Needs s.mu.
void fold(State& s, bool keep) {
  for (auto it = s.entries.begin(); it != s.entries.end();) {
    Entry& e = it->second;
    if (!e.closed) {
      ++it;
      continue;
    }
    check_cuda(cudaEventSynchronize(e.end), "cudaEventSynchronize (profiler)");
    if (keep) {
      float ms = 0.f;
      check_cuda(cudaEventElapsedTime(&ms, e.start, e.end), "cudaEventElapsedTime (profiler)");
      Totals& t = s.totals[e.op];
      t.calls += 1;
      t.ms += ms;
      t.flops += e.flops;
      t.bytes += e.bytes;
    }
    s.pool.push_back(e.start);
    s.pool.push_back(e.end);
    it = s.entries.erase(it);
  }
}

}  // namespace

OpScope::OpScope(CUstream_st* stream, const char* op, double flops, double bytes)
    : stream_(stream) {
  State& s = state();
  if (!s.on.load(std::memory_order_relaxed)) return;
  if (t_depth > 0) {
    nested_ = true;
    ++t_depth;
    return;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  Entry e;
  e.op = op;
  e.flops = flops;
  e.bytes = bytes;
  e.start = take_event(s);
  e.end = take_event(s);
  check_cuda(cudaEventRecord(e.start, stream_), "cudaEventRecord (profiler)");
  slot_ = s.next_slot++;
  s.entries.emplace(slot_, std::move(e));
  ++t_depth;
}

void OpScope::detail(const char* d) {
  if (slot_ < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(slot_);
  if (it != s.entries.end()) it->second.op += fmt::format("[{}]", d);
}

OpScope::~OpScope() {
  if (nested_) {
    --t_depth;
    return;
  }
  if (slot_ < 0) return;
  --t_depth;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(slot_);
  if (it == s.entries.end()) return;  // dropped by a cuda_profile_start meanwhile
  // A failed record only loses this entry's time; a destructor must not throw.
  if (cudaEventRecord(it->second.end, stream_) != cudaSuccess) {
    cudaGetLastError();
    s.pool.push_back(it->second.start);
    s.pool.push_back(it->second.end);
    s.entries.erase(it);
    return;
  }
  it->second.closed = true;
  if (s.entries.size() >= kFoldEvery) fold(s, s.on.load());
}

double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (const Tensor* t : ts)
    if (t != nullptr && t->defined()) b += static_cast<double>(t->nbytes());
  return b;
}

}  // namespace strata::tensor::cuda

namespace strata::tensor {

void cuda_profile_start() {
  cuda::State& s = cuda::state();
  std::lock_guard<std::mutex> lock(s.mu);
  cuda::fold(s, false);
  s.totals.clear();
  s.on.store(true);
}

std::vector<CudaOpTime> cuda_profile_stop() {
  cuda::State& s = cuda::state();
  s.on.store(false);
  std::lock_guard<std::mutex> lock(s.mu);
  cuda::fold(s, true);
  std::vector<CudaOpTime> rows;
  for (const auto& [op, t] : s.totals) rows.push_back({op, t.calls, t.ms, t.flops, t.bytes});
  std::sort(rows.begin(), rows.end(), [](const CudaOpTime& a, const CudaOpTime& b) {
    return a.ms != b.ms ? a.ms > b.ms : a.op < b.op;
  });
  s.totals.clear();
  return rows;
}

CudaProfileScope::CudaProfileScope(const char* op, double flops, double bytes)
    : impl_(cuda::state().on.load(std::memory_order_relaxed)
                ? new cuda::OpScope(static_cast<CUstream_st*>(cuda::current_stream()), op, flops,
                                    bytes)
                : nullptr) {}

CudaProfileScope::~CudaProfileScope() {
  delete static_cast<cuda::OpScope*>(impl_);
}

}  // namespace strata::tensor
