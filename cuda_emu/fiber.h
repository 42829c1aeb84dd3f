#pragma once
// Fibers for the emulated threads of a block (Note [CUDA emulator] in simt.h).
//
// Note [Fiber switch]
// A switch saves what the System V ABI says a callee preserves (rbx, rbp, r12-r15, the MXCSR and
// x87 control words) on the old stack, stores the stack pointer, loads the new one and restores
// the same from there: a dozen instructions, no system call (swapcontext saves the signal mask
// with a sigprocmask call on every switch, which a kernel of 1024 threads x several shuffles
// cannot afford). Other architectures fall back to ucontext. A fiber's entry function must never
// return: it switches away for the last time instead.
#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace strata::cuda_emu {

struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// An mmap'ed stack with a guard page below it.
class FiberStack {
 public:
  explicit FiberStack(size_t bytes);
  ~FiberStack();
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;

  char* top() const { return base_ + guard_ + bytes_; }
  // The guard page: an access there is a stack overflow.
  bool in_guard(const void* p) const;
  size_t bytes() const { return bytes_; }

 private:
  char* base_ = nullptr;
  size_t guard_ = 0;
  size_t bytes_ = 0;
};

// Prepares `ctx` so that the next switch into it runs entry(arg) on `stack`, starting `color`
// bytes below its top: stacks a fixed power-of-two stride apart would otherwise put every
// thread's frames in the same cache sets.
void fiber_init(FiberContext& ctx, FiberStack& stack, void (*entry)(void*), void* arg,
                size_t color = 0);

// Saves the running context in `from` and continues `to` (Note [Fiber switch]).
void fiber_switch(FiberContext& from, FiberContext& to);

}  // namespace strata::cuda_emu
