#include "cuda_emu/device_memory.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_emu/control.h"

namespace strata::cuda_emu {

namespace {

thread_local bool t_on_device = false;
thread_local const char* t_op_what = nullptr;
DescribeFn g_describe = nullptr;

// What the current device operation opened (Note [Emulated device memory]); written by the fault
// handler too, so a fixed array rather than a container that allocates.
constexpr size_t kMaxOpened = 4096;
Allocation* g_opened[kMaxOpened];
size_t g_opened_count = 0;
bool g_opened_overflow = false;

struct sigaction g_old_action;

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "strata CUDA emulator: %s=%s is not a number\n", name, v);
    std::abort();
  }
  return static_cast<size_t>(x);
}

// Async-signal-safe enough for a message written just before abort().
void say(const char* msg) {
  const size_t n = std::strlen(msg);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(2, msg + done, n - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
}

[[noreturn]] void fault_abort(const char* msg, bool trace) {
  say(msg);
  if (trace) {
    void* frames[48];
    const int n = backtrace(frames, 48);
    say("backtrace:\n");
    backtrace_symbols_fd(frames, n, 2);
  }
  signal(SIGABRT, SIG_DFL);
  std::abort();
}

void on_segv(int sig, siginfo_t* info, void* uctx) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  DeviceMemory& mem = DeviceMemory::get();
  char msg[768];
  if (t_on_device) {
    // This thread holds the device mutex: the allocation table cannot change under us.
    Allocation* a = mem.find_mapping(info->si_addr);
    if (a != nullptr && addr >= a->base && addr < a->base + a->data && !a->open) {
      mem.open(*a);
      return;  // resume the access, now allowed
    }
    char where[256] = "";
    const bool overflow = g_describe != nullptr && g_describe(info->si_addr, where, sizeof(where));
    const char* what = t_op_what ? t_op_what : "device operation";
    if (overflow) {
      std::snprintf(msg, sizeof(msg),
                    "strata CUDA emulator: %s, %s: stack overflow (the emulated thread stacks "
                    "are STRATA_CUDA_EMU_STACK_KIB KiB; raise it for deep device recursion)\n",
                    what, where);
    } else if (a != nullptr) {
      const long long off = static_cast<long long>(addr) - static_cast<long long>(a->base);
      std::snprintf(msg, sizeof(msg),
                    "strata CUDA emulator: %s, %s: out-of-bounds access at %p, byte offset %lld "
                    "of a %zu-byte allocation at %p\n",
                    what, where, info->si_addr, off, a->bytes, reinterpret_cast<void*>(a->base));
    } else {
      std::snprintf(msg, sizeof(msg),
                    "strata CUDA emulator: %s, %s: invalid address %p (not in any device "
                    "allocation; a real GPU reports cudaErrorIllegalAddress)\n",
                    what, where, info->si_addr);
    }
    fault_abort(msg, g_describe == nullptr);
  }
  // Host code. Another thread may be changing the table: look only when it is free.
  Allocation* a = nullptr;
  if (mem.mutex().try_lock()) {
    a = mem.find_mapping(info->si_addr);
    mem.mutex().unlock();
  }
  if (a != nullptr) {
    std::snprintf(msg, sizeof(msg),
                  "strata CUDA emulator: host code accessed device memory at %p (byte offset "
                  "%lld of a %zu-byte cudaMalloc allocation at %p). Device memory is only "
                  "accessible to kernels, cudaMemcpy and cudaMemset: copy it to the host first.\n",
                  info->si_addr, static_cast<long long>(addr) - static_cast<long long>(a->base),
                  a->bytes, reinterpret_cast<void*>(a->base));
    fault_abort(msg, true);
  }
  // Not ours: give the fault back to whoever handled it before (the default: a core dump).
  (void)sig;
  (void)uctx;
  sigaction(SIGSEGV, &g_old_action, nullptr);
}

void ensure_alt_stack() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  stack_t current{};
  if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return;
  // A stack overflow in an emulated thread must still be reported: the handler runs here.
  constexpr size_t kBytes = 64 << 10;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  stack_t ss{};
  ss.ss_sp = p;
  ss.ss_size = kBytes;
  sigaltstack(&ss, nullptr);
}

}  // namespace

void install_fault_handler() {
  static const bool installed = [] {
    void* warm[4];
    backtrace(warm, 4);  // loads libgcc now, not inside the handler
    struct sigaction sa {};
    sa.sa_sigaction = &on_segv;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &g_old_action);
    return true;
  }();
  (void)installed;
}

void set_fault_context(DescribeFn describe) {
  g_describe = describe;
}

DeviceMemory& DeviceMemory::get() {
  static DeviceMemory* m = new DeviceMemory();  // never destroyed: static destructors may still
  return *m;                                    // free device memory at exit
}

DeviceMemory::DeviceMemory() {
  cap_ = env_size("STRATA_CUDA_EMU_MEMORY_MIB", 4096) << 20;
  // Note [Emulator dry run]: poison would touch every page the run asks for.
  poison_ = env_size("STRATA_CUDA_EMU_POISON", 1) != 0 && !dry_run();
}

cudaError_t DeviceMemory::allocate(void** ptr, size_t bytes) {
  install_fault_handler();
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (bytes > cap_ || used_ > cap_ - bytes) return cudaErrorMemoryAllocation;
  const size_t page = page_size();
  Allocation a;
  a.bytes = bytes;
  a.data = (bytes + page - 1) / page * page;
  a.map_bytes = a.data + 2 * page;
  void* m =
      mmap(nullptr, a.map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  a.map = reinterpret_cast<uintptr_t>(m);
  a.base = a.map + page;
  if (poison_) {
    void* d = reinterpret_cast<void*>(a.base);
    mprotect(d, a.data, PROT_READ | PROT_WRITE);
    std::memset(d, 0xff, a.data);
    mprotect(d, a.data, PROT_NONE);
  }
  allocations_.emplace(a.map, a);
  used_ += bytes;
  *ptr = reinterpret_cast<void*>(a.base);
  return cudaSuccess;
}

cudaError_t DeviceMemory::free(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Allocation* a = find_mapping(ptr);
  if (a == nullptr || a->base != reinterpret_cast<uintptr_t>(ptr)) return cudaErrorInvalidValue;
  used_ -= a->bytes;
  const uintptr_t map = a->map;
  munmap(reinterpret_cast<void*>(map), a->map_bytes);
  allocations_.erase(map);
  return cudaSuccess;
}

Allocation* DeviceMemory::find_mapping(const void* p) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = allocations_.upper_bound(x);
  if (it == allocations_.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  return x < a.map + a.map_bytes ? &a : nullptr;
}

Allocation* DeviceMemory::find(const void* p, size_t bytes) {
  Allocation* a = find_mapping(p);
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  if (a == nullptr || x < a->base || bytes > a->bytes || x - a->base > a->bytes - bytes)
    return nullptr;
  return a;
}

void DeviceMemory::open(Allocation& a) {
  if (a.open) return;
  mprotect(reinterpret_cast<void*>(a.base), a.data, PROT_READ | PROT_WRITE);
  a.open = true;
  if (g_opened_count < kMaxOpened)
    g_opened[g_opened_count++] = &a;
  else
    g_opened_overflow = true;
}

void DeviceMemory::open_pointed_to(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t off = 0; off + sizeof(uintptr_t) <= bytes; off += sizeof(uintptr_t)) {
    uintptr_t w;
    std::memcpy(&w, c + off, sizeof(w));
    if (w == 0) continue;
    Allocation* a = find_mapping(reinterpret_cast<const void*>(w));
    if (a != nullptr && w >= a->base && w < a->base + a->data) open(*a);
  }
}

void DeviceMemory::close_opened() {
  for (size_t i = 0; i < g_opened_count; ++i) {
    mprotect(reinterpret_cast<void*>(g_opened[i]->base), g_opened[i]->data, PROT_NONE);
    g_opened[i]->open = false;
  }
  g_opened_count = 0;
  if (g_opened_overflow) {
    for (auto& [map, a] : allocations_) {
      if (!a.open) continue;
      mprotect(reinterpret_cast<void*>(a.base), a.data, PROT_NONE);
      a.open = false;
    }
    g_opened_overflow = false;
  }
}

cudaError_t DeviceMemory::host_alloc(void** ptr, size_t bytes) {
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  pinned_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t DeviceMemory::host_free(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  auto it = pinned_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == pinned_.end()) return cudaErrorInvalidValue;
  munmap(ptr, it->second);
  pinned_.erase(it);
  return cudaSuccess;
}

bool DeviceMemory::is_pinned(const void* p, size_t bytes) const {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = pinned_.upper_bound(x);
  if (it == pinned_.begin()) return false;
  --it;
  return x - it->first < it->second && bytes <= it->second - (x - it->first);
}

DeviceOp::DeviceOp(const char* what) : lock_(DeviceMemory::get().mutex()) {
  install_fault_handler();
  ensure_alt_stack();
  t_on_device = true;
  t_op_what = what;
}

DeviceOp::~DeviceOp() {
  DeviceMemory::get().close_opened();
  t_on_device = false;
  t_op_what = nullptr;
}

}  // namespace strata::cuda_emu
