#pragma once
// The device side of the CUDA emulator: force-included (-include) into every .cu file of a
// STRATA_CUDA_EMULATION build, which compiles them as plain C++ and runs their kernels on the CPU
// (Note [CUDA emulator] in cuda_emu/simt.h).
//
// The real CUDA headers come first, in host mode (no __CUDACC__): they give dim3, the vector
// types, the cudaError_t enums and host implementations of the bf16/f16 conversions. Then this
// header turns the execution-space keywords into plain C++ (a __shared__ array becomes a static
// one: blocks run one at a time, so one copy per kernel is the block's shared memory), defines
// threadIdx/blockIdx/blockDim/gridDim as the emulator's per-thread state, the barriers and warp
// intrinsics as calls into the scheduler, exact host versions of the device math intrinsics, and
// STRATA_LAUNCH (Note [Kernel launches] in tensor/cuda/launch.cuh) as a launch on the emulator,
// and nvcuda::wmma (cuda_emu/wmma.h).
//
// Compile with -ffp-contract=off: a device `a * b + c` is two rounded operations unless nvcc
// contracts it, and the __f*_rn intrinsics promise exactly one rounding each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu/simt.h"

// ---- execution spaces and qualifiers ----
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __shared__
#define __shared__ static
#undef __constant__
#define __constant__
#undef __managed__
#define __managed__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __maxnreg__
#define __maxnreg__(...)
#undef __grid_constant__
#define __grid_constant__

// ---- built-in variables: the current emulated thread (Note [CUDA emulator]) ----
#define threadIdx (static_cast<const uint3&>(::strata::cuda_emu::g_thread_idx))
#define blockIdx (static_cast<const uint3&>(::strata::cuda_emu::g_block_idx))
#define blockDim (static_cast<const uint3&>(::strata::cuda_emu::g_block_dim))
#define gridDim (static_cast<const uint3&>(::strata::cuda_emu::g_grid_dim))
inline constexpr int warpSize =
    32;  // a variable, not a macro: cudaDeviceProp has a member of that name

// ---- barriers ----
inline void __syncthreads() {
  ::strata::cuda_emu::block_barrier(::strata::cuda_emu::BlockOp::Sync, 0);
}
inline int __syncthreads_count(int pred) {
  return ::strata::cuda_emu::block_barrier(::strata::cuda_emu::BlockOp::Count, pred != 0);
}
inline int __syncthreads_and(int pred) {
  return ::strata::cuda_emu::block_barrier(::strata::cuda_emu::BlockOp::And, pred != 0);
}
inline int __syncthreads_or(int pred) {
  return ::strata::cuda_emu::block_barrier(::strata::cuda_emu::BlockOp::Or, pred != 0);
}
// One emulated thread runs at a time and blocks run in sequence: every write is visible to the
// next reader already. Fences only order; there is nothing to order.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

// ---- warp intrinsics (barriers over the lanes named in `mask`) ----
namespace strata::cuda_emu {
template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "warp shuffles move values of at most 64 bits");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
template <typename T>
inline T shuffle(WarpOp op, unsigned mask, T var, int arg, int width) {
  return from_bits<T>(warp_collective(op, mask, to_bits(var), arg, width));
}
}  // namespace strata::cuda_emu

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::strata::cuda_emu::shuffle(::strata::cuda_emu::WarpOp::ShflIdx, mask, var, src_lane,
                                     width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::strata::cuda_emu::shuffle(::strata::cuda_emu::WarpOp::ShflUp, mask, var,
                                     static_cast<int>(delta), width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::strata::cuda_emu::shuffle(::strata::cuda_emu::WarpOp::ShflDown, mask, var,
                                     static_cast<int>(delta), width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::strata::cuda_emu::shuffle(::strata::cuda_emu::WarpOp::ShflXor, mask, var, lane_mask,
                                     width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(::strata::cuda_emu::warp_collective(
      ::strata::cuda_emu::WarpOp::Ballot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return __ballot_sync(mask, pred) != 0;
}
inline int __all_sync(unsigned mask, int pred) {
  return __ballot_sync(mask, pred) == mask;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::strata::cuda_emu::warp_collective(::strata::cuda_emu::WarpOp::SyncWarp, mask, 0, 0, 32);
}
inline unsigned __activemask() {
  return ::strata::cuda_emu::active_mask();
}

// ---- arithmetic intrinsics: one IEEE operation each ----
// Note [Emulated FMA contraction]
// nvcc contracts a * b + c into one FMA by default (-fmad=true), where its optimiser finds the
// pair in one block; only the __f*_rn intrinsics are never contracted. The emulated kernels are
// compiled the same way where the host has FMA (-ffp-contract=fast -mfma,
// STRATA_CUDA_EMU_FMA_CONTRACT in third_party/cmake/StrataDependencies.cmake): GCC contracts by
// its own rules, not nvcc's, but code whose bits depend on whether a product was rounded before
// an add (two paths promised equal, a formula promised to round twice) shows here too. The
// intrinsics below keep one rounding each: the empty asm makes each operand and result an opaque
// register value, so GCC cannot fuse the operation with the multiply that produced an operand or
// the add that consumes its result.
#if defined(__x86_64__)
#define STRATA_EMU_ROUNDED(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define STRATA_EMU_ROUNDED(v) __asm__("" : "+w"(v))
#else
#define STRATA_EMU_ROUNDED(v) (void)(v)  // no contraction is enabled on other hosts
#endif
inline float __fadd_rn(float a, float b) {
  STRATA_EMU_ROUNDED(a);
  STRATA_EMU_ROUNDED(b);
  float r = a + b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline float __fsub_rn(float a, float b) {
  STRATA_EMU_ROUNDED(a);
  STRATA_EMU_ROUNDED(b);
  float r = a - b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline float __fmul_rn(float a, float b) {
  float r = a * b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline float __frcp_rn(float a) {
  return 1.0f / a;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline double __dadd_rn(double a, double b) {
  STRATA_EMU_ROUNDED(a);
  STRATA_EMU_ROUNDED(b);
  double r = a + b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline double __dsub_rn(double a, double b) {
  STRATA_EMU_ROUNDED(a);
  STRATA_EMU_ROUNDED(b);
  double r = a - b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline double __dmul_rn(double a, double b) {
  double r = a * b;
  STRATA_EMU_ROUNDED(r);
  return r;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}
inline double __fma_rn(double a, double b, double c) {
  return std::fma(a, b, c);
}
// CUDA declares the classification functions in the global namespace for device code.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

// The device's approximate forms, computed exactly: the emulator checks indexing and
// synchronisation, not the last bits of a fast-math function (cuda_emu/README.md).
inline float rsqrtf(float a) {
  return 1.0f / std::sqrt(a);
}
inline double rsqrt(double a) {
  return 1.0 / std::sqrt(a);
}
inline float __expf(float a) {
  return std::exp(a);
}
inline float __logf(float a) {
  return std::log(a);
}
inline float __sinf(float a) {
  return std::sin(a);
}
inline float __cosf(float a) {
  return std::cos(a);
}
inline float __tanf(float a) {
  return std::tan(a);
}
inline float __powf(float a, float b) {
  return std::pow(a, b);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __saturatef(float a) {
  return a > 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f);  // NaN -> 0
}

// ---- integer intrinsics ----
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) {
  return static_cast<int>((static_cast<int64_t>(a) * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
inline int __ffsll(long long x) {
  return __builtin_ffsll(x);
}
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
  return (x >> 16) | (x << 16);
}

// Device min/max: CUDA overloads them for every arithmetic type; mixed integer arguments take
// the usual arithmetic conversions, floats follow fminf/fmaxf (a NaN loses).
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

// Read-only cache loads are plain loads here.
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- atomics: one emulated thread runs at a time and never between the read and the write ----
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicSub(T* p, T v) {
  const T old = *p;
  *p = old - v;
  return old;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

// ---- launches (Note [Kernel launches]) ----
// STRATA_LAUNCH(grid, block, smem, stream, kernel)(args...): the kernel is named inside a generic
// lambda, so a template kernel deduces its arguments from the call as a triple-chevron launch
// does; the arguments are copied once (the parameter block, kept with the lambda until the
// kernel runs: Note [Emulated streams]) and every emulated thread calls the kernel with them, by
// value.
namespace strata::cuda_emu {

template <typename K>
class Launcher {
 public:
  Launcher(const LaunchConfig& config, K kernel) : config_(config), kernel_(std::move(kernel)) {}

  template <typename... A>
  void operator()(A&&... args) {
    using Params = std::tuple<std::decay_t<A>...>;
    struct Job final : KernelJob {
      Job(K k, Params p) : kernel(std::move(k)), args(std::move(p)) {
        params = &args;
        params_bytes = sizeof(Params);
      }
      void run_thread() override { std::apply(kernel, args); }
      K kernel;
      Params args;
    };
    launch(config_, std::make_shared<Job>(kernel_, Params(std::forward<A>(args)...)));
  }

 private:
  LaunchConfig config_;
  K kernel_;
};

}  // namespace strata::cuda_emu

// The lambda captures by copy: it runs after the launching function has returned.
#define STRATA_LAUNCH(grid, block, smem, stream, ...)                                      \
  ::strata::cuda_emu::Launcher(                                                            \
      ::strata::cuda_emu::LaunchConfig{dim3(grid), dim3(block), static_cast<size_t>(smem), \
                                       (stream), #__VA_ARGS__, __FILE__, __LINE__},        \
      [=](auto&... strata_emu_params) { __VA_ARGS__(strata_emu_params...); })

// ---- warp matrix functions (mma.h): Note [Emulated WMMA] ----
#include "cuda_emu/wmma.h"
