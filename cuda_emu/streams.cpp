// Streams and events of the emulated device: queues of pending work (Note [Emulated streams] in
// streams.h) and the runtime API calls on them.
#include "cuda_emu/streams.h"

#include <execinfo.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuda_emu/control.h"

namespace strata::cuda_emu {

namespace {

struct Queue;

// "Queue q has finished its op number seq."
struct Wait {
  std::shared_ptr<Queue> q;
  uint64_t seq = 0;
};

struct Op {
  uint64_t seq = 0;
  std::vector<Wait> waits;
  std::function<void()> run;  // empty for markers that only wait
};

struct Queue {
  bool legacy = false;    // the legacy default stream
  bool blocking = false;  // synchronizes with the legacy stream (not cudaStreamNonBlocking)
  bool destroyed = false;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  std::deque<Op> ops;
};

struct Stream {
  unsigned flags = 0;
  int priority = 0;
  std::shared_ptr<Queue> q;
};

// The state an event's record captured; shared with the marker op that stamps its time.
struct Record {
  std::shared_ptr<Queue> q;
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point when;
  bool stamped = false;
};

struct Event {
  unsigned flags = 0;
  std::shared_ptr<Record> rec;  // null until recorded
};

// Handles, guarded by their own mutex (created and destroyed from any host thread).
std::mutex g_handles_mu;
std::unordered_set<Stream*> g_streams;
std::unordered_set<Event*> g_events;

// The scheduler: every queue with work or a live handle, newest last. Held while work runs.
std::mutex g_sched_mu;
std::vector<std::shared_ptr<Queue>> g_queues;
std::shared_ptr<Queue> g_legacy;
std::shared_ptr<Queue> g_per_thread;
thread_local bool t_running = false;  // this host thread is running device work

StreamMode initial_mode() {
  const char* v = std::getenv("STRATA_CUDA_EMU_STREAMS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "deferred") == 0) return StreamMode::Deferred;
  if (std::strcmp(v, "immediate") == 0) return StreamMode::Immediate;
  std::fprintf(stderr,
               "strata CUDA emulator: STRATA_CUDA_EMU_STREAMS=%s; use deferred or immediate\n", v);
  std::abort();
}
StreamMode g_mode = initial_mode();

uint64_t g_host_waits = 0;
uint64_t g_idle_waits = 0;

// STRATA_CUDA_EMU_TRACE_WAITS=1: each host wait for pending work prints the host's stack, to
// find where a step synchronizes (Stats::host_waits counts them).
bool trace_waits() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_TRACE_WAITS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Callers hold g_sched_mu.
void count_wait(const char* what) {
  ++g_host_waits;
  if (!trace_waits()) return;
  std::fprintf(stderr, "strata CUDA emulator: host wait #%llu (%s) at:\n",
               static_cast<unsigned long long>(g_host_waits), what);
  void* frames[16];
  const int n = backtrace(frames, 16);
  backtrace_symbols_fd(frames + 1, n - 1, 2);
}

// Callers hold g_sched_mu; after the work a counted wait on queue q waited for has run. Nothing
// left queued on q: on a GPU, q's stream now idles until the host enqueues more
// (Stats::idle_waits). Other streams are not looked at: the emulator defers their work until
// someone waits for it, where a device would have run it long before.
void count_if_idle(const Queue& q) {
  if (q.completed < q.enqueued) return;
  ++g_idle_waits;
  if (trace_waits()) std::fprintf(stderr, "strata CUDA emulator: (it left the device idle)\n");
}

// Callers hold g_sched_mu.
void init_default_queues() {
  if (g_legacy) return;
  g_legacy = std::make_shared<Queue>();
  g_legacy->legacy = true;
  g_per_thread = std::make_shared<Queue>();
  g_per_thread->blocking = true;
  g_queues.push_back(g_legacy);
  g_queues.push_back(g_per_thread);
}

std::shared_ptr<Queue> queue_of(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return g_legacy;
  if (s == cudaStreamPerThread) return g_per_thread;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  auto* st = reinterpret_cast<Stream*>(s);
  return g_streams.count(st) ? st->q : nullptr;
}

// Runs q's work up to and including op `target`, and first whatever each op waits for. A wait
// always names work enqueued before the op that waits, so this cannot cycle.
void advance(Queue& q, uint64_t target) {
  while (q.completed < target) {
    Op op = std::move(q.ops.front());
    q.ops.pop_front();
    for (Wait& w : op.waits) advance(*w.q, w.seq);
    if (op.run) {
      t_running = true;
      op.run();
      t_running = false;
    }
    q.completed = op.seq;
  }
}

void prune() {
  std::erase_if(g_queues, [](const std::shared_ptr<Queue>& q) {
    return q->destroyed && q->completed == q->enqueued;
  });
}

void drain_all_locked() {
  for (auto it = g_queues.rbegin(); it != g_queues.rend(); ++it) {
    std::shared_ptr<Queue> q = *it;  // kept alive: advance may not prune, but be safe
    advance(*q, q->enqueued);
  }
  prune();
}

bool pending_anywhere() {
  for (const auto& q : g_queues)
    if (q->completed < q->enqueued) return true;
  return false;
}

// Appends an op to q with the legacy stream's implicit waits and `extra`; returns its number.
uint64_t push(Queue& q, std::vector<Wait> extra, std::function<void()> run) {
  Op op;
  op.seq = ++q.enqueued;
  op.waits = std::move(extra);
  if (q.legacy) {
    for (const auto& b : g_queues)
      if (b->blocking && b->completed < b->enqueued) op.waits.push_back({b, b->enqueued});
  } else if (q.blocking && g_legacy->completed < g_legacy->enqueued) {
    op.waits.push_back({g_legacy, g_legacy->enqueued});
  }
  op.run = std::move(run);
  q.ops.push_back(std::move(op));
  return q.enqueued;
}

bool record_done(const Record& r) {
  return r.q->completed >= r.seq;
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) record_error(e);
  return e;
}

Event* event_of(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  auto* ev = reinterpret_cast<Event*>(e);
  return g_events.count(ev) ? ev : nullptr;
}

}  // namespace

void set_stream_mode(StreamMode mode) {
  drain_all();
  std::lock_guard<std::mutex> lock(g_sched_mu);
  g_mode = mode;
}

StreamMode stream_mode() {
  return g_mode;
}

void enqueue(cudaStream_t s, std::function<void()> op) {
  if (g_mode == StreamMode::Immediate || t_running) return op();
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(s);
  if (!q) return;  // callers validated the handle; a race with cudaStreamDestroy drops nothing
  push(*q, {}, std::move(op));
}

void enqueue_and_wait(cudaStream_t s, std::function<void()> op) {
  if (g_mode == StreamMode::Immediate || t_running) return op();
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(s);
  if (!q) return;
  const uint64_t seq = push(*q, {}, std::move(op));
  count_wait("a synchronous copy");
  advance(*q, seq);
  count_if_idle(*q);
}

void drain_all() {
  if (t_running) return;
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  const bool waits = pending_anywhere();
  if (waits) count_wait("the device");
  drain_all_locked();
  if (waits) count_if_idle(*g_legacy);
}

uint64_t host_waits() {
  std::lock_guard<std::mutex> lock(g_sched_mu);
  return g_host_waits;
}

uint64_t idle_waits() {
  std::lock_guard<std::mutex> lock(g_sched_mu);
  return g_idle_waits;
}

bool valid_stream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_streams.count(reinterpret_cast<Stream*>(s)) > 0;
}

}  // namespace strata::cuda_emu

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

extern "C" {

cudaError_t cudaDeviceSynchronize(void) {
  drain_all();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (stream == nullptr || (flags & ~unsigned{cudaStreamNonBlocking}) != 0)
    return ret(cudaErrorInvalidValue);
  auto* s = new Stream{flags, priority, std::make_shared<Queue>()};
  s->q->blocking = (flags & cudaStreamNonBlocking) == 0;
  {
    std::lock_guard<std::mutex> lock(g_sched_mu);
    init_default_queues();
    g_queues.push_back(s->q);
  }
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_streams.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, 0, 0);
}

// As on the device, pending work of a destroyed stream still runs (when something waits for it).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::shared_ptr<Queue> q;
  {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    auto* s = reinterpret_cast<Stream*>(stream);
    if (g_streams.erase(s) == 0) return ret(cudaErrorInvalidResourceHandle);
    q = s->q;
    delete s;
  }
  std::lock_guard<std::mutex> lock(g_sched_mu);
  q->destroyed = true;
  prune();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream) || t_running) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(stream);
  if (!q) return ret(cudaErrorInvalidResourceHandle);
  const bool waits = q->completed < q->enqueued;
  if (waits) count_wait("cudaStreamSynchronize");
  advance(*q, q->enqueued);
  if (waits) count_if_idle(*q);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!valid_stream(stream)) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(stream);
  if (!q) return ret(cudaErrorInvalidResourceHandle);
  if (q->completed == q->enqueued) return cudaSuccess;
  advance(*q, q->enqueued);  // the device makes progress; the next query sees it done
  return ret(cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  Event* e = event_of(event);
  if (!valid_stream(stream) || e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (g_mode == StreamMode::Immediate) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(stream);
  if (!q) return ret(cudaErrorInvalidResourceHandle);
  // The record current now; a never-recorded event is complete.
  if (e->rec && !record_done(*e->rec) && e->rec->q != q)
    push(*q, {Wait{e->rec->q, e->rec->seq}}, nullptr);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return ret(cudaErrorInvalidValue);
  auto* e = new Event{};
  e->flags = flags;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  auto* e = reinterpret_cast<Event*>(event);
  if (g_events.erase(e) == 0) return ret(cudaErrorInvalidResourceHandle);
  delete e;  // a pending record keeps its own state alive
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* e = event_of(event);
  if (!valid_stream(stream) || e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  init_default_queues();
  std::shared_ptr<Queue> q = queue_of(stream);
  if (!q) return ret(cudaErrorInvalidResourceHandle);
  auto rec = std::make_shared<Record>();
  rec->q = q;
  auto stamp = [rec] {
    rec->when = std::chrono::steady_clock::now();
    rec->stamped = true;
  };
  if (g_mode == StreamMode::Immediate || t_running) {
    rec->seq = q->completed;
    stamp();
  } else {
    rec->seq = push(*q, {}, stamp);
  }
  e->rec = rec;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Event* e = event_of(event);
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  if (!e->rec || record_done(*e->rec)) return cudaSuccess;
  advance(*e->rec->q, e->rec->seq);  // the device makes progress; the next query sees it done
  return ret(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Event* e = event_of(event);
  if (e == nullptr || t_running) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  if (e->rec && !record_done(*e->rec)) {
    count_wait("cudaEventSynchronize");
    advance(*e->rec->q, e->rec->seq);
    count_if_idle(*e->rec->q);
  }
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return ret(cudaErrorInvalidValue);
  Event* a = event_of(start);
  Event* b = event_of(end);
  if (a == nullptr || b == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  if (!a->rec || !b->rec) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_sched_mu);
  if (!a->rec->stamped || !b->rec->stamped) return ret(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->rec->when - a->rec->when).count();
  return cudaSuccess;
}

}  // extern "C"
