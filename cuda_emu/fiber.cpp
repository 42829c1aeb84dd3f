#include "cuda_emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace strata::cuda_emu {

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "strata CUDA emulator: %s\n", what);
  std::abort();
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace

FiberStack::FiberStack(size_t bytes) {
  guard_ = page_size();
  bytes_ = (bytes + guard_ - 1) / guard_ * guard_;
  void* p = mmap(nullptr, guard_ + bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) die("cannot map a fiber stack");
  base_ = static_cast<char*>(p);
  if (mprotect(base_, guard_, PROT_NONE) != 0) die("cannot protect a fiber stack's guard page");
}

FiberStack::~FiberStack() {
  munmap(base_, guard_ + bytes_);
}

bool FiberStack::in_guard(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + guard_;
}

#if defined(__x86_64__)

// Note [Fiber switch]. strata_emu_swap(void** save_sp, void* load_sp).
// strata_emu_fiber_start is where a new fiber's first switch returns to: r12 holds the entry
// function and r13 its argument (both restored from the initial frame fiber_init writes).
asm(R"(
  .text
  .globl strata_emu_swap
  .type strata_emu_swap, @function
strata_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size strata_emu_swap, .-strata_emu_swap

  .globl strata_emu_fiber_start
  .type strata_emu_fiber_start, @function
strata_emu_fiber_start:
  movq %r13, %rdi
  callq *%r12
  ud2
  .size strata_emu_fiber_start, .-strata_emu_fiber_start
  .section .note.GNU-stack,"",@progbits
  .text
)");

extern "C" void strata_emu_swap(void** save_sp, void* load_sp);
extern "C" void strata_emu_fiber_start();

void fiber_init(FiberContext& ctx, FiberStack& stack, void (*entry)(void*), void* arg,
                size_t color) {
  // The frame strata_emu_swap pops, from the lowest address: control words, r15, r14, r13, r12,
  // rbx, rbp, return address. The return address sits 8 bytes off 16-byte alignment, so that
  // strata_emu_fiber_start runs with an aligned stack and its call gives the entry the ABI's
  // alignment.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack.top()) - color) & ~uintptr_t{15};
  auto* ret = reinterpret_cast<uint64_t*>(top - 24);
  uint64_t* frame = ret - 7;
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fpucw) << 32);
  frame[1] = 0;                                  // r15
  frame[2] = 0;                                  // r14
  frame[3] = reinterpret_cast<uint64_t>(arg);    // r13
  frame[4] = reinterpret_cast<uint64_t>(entry);  // r12
  frame[5] = 0;                                  // rbx
  frame[6] = 0;                                  // rbp
  ret[0] = reinterpret_cast<uint64_t>(&strata_emu_fiber_start);
  ctx.sp = frame;
}

void fiber_switch(FiberContext& from, FiberContext& to) {
  strata_emu_swap(&from.sp, to.sp);
}

#else  // ucontext fallback

namespace {
void trampoline(unsigned lo_f, unsigned hi_f, unsigned lo_a, unsigned hi_a) {
  auto f = reinterpret_cast<void (*)(void*)>((static_cast<uintptr_t>(hi_f) << 32) | lo_f);
  auto a = reinterpret_cast<void*>((static_cast<uintptr_t>(hi_a) << 32) | lo_a);
  f(a);
  die("a fiber's entry returned");
}
}  // namespace

void fiber_init(FiberContext& ctx, FiberStack& stack, void (*entry)(void*), void* arg,
                size_t color) {
  (void)color;
  if (getcontext(&ctx.uc) != 0) die("getcontext failed");
  ctx.uc.uc_stack.ss_sp = stack.top() - stack.bytes();
  ctx.uc.uc_stack.ss_size = stack.bytes();
  ctx.uc.uc_link = nullptr;
  const auto f = reinterpret_cast<uintptr_t>(entry);
  const auto a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&ctx.uc, reinterpret_cast<void (*)()>(&trampoline), 4, static_cast<unsigned>(f),
              static_cast<unsigned>(f >> 32), static_cast<unsigned>(a),
              static_cast<unsigned>(a >> 32));
}

void fiber_switch(FiberContext& from, FiberContext& to) {
  if (swapcontext(&from.uc, &to.uc) != 0) die("swapcontext failed");
}

#endif

}  // namespace strata::cuda_emu
