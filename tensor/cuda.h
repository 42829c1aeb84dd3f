#pragma once
// Whether Strata can use a GPU here, and the call that turns the CUDA backend on.
//
// Note [CUDA backend registration]
// The CUDA backend and the GPU caching allocator are registered by init_cuda(), never by a
// static initialiser (a static library's self-registering object is dropped by the linker when
// nothing references it; Note [Model registry] in models/registry.h). backend_for() and
// allocator_for() call init_cuda() the first time a CUDA device is asked for, so `train` with
// `device: cuda` needs no extra step; calling it early just moves the error (no GPU) to the start.
// These functions exist in every build: without the CUDA toolkit they report no device and
// init_cuda() raises a UserError saying how to get a CUDA build.
#include <cstdint>
#include <string>
#include <vector>

namespace strata::tensor {

bool cuda_built();        // this binary contains the CUDA backend
int cuda_device_count();  // visible devices; 0 when none, no driver, or not built (never throws)
bool cuda_available();    // cuda_device_count() > 0
// Makes `device` this process's GPU (one process per device) and registers the backend and the
// allocator. Idempotent for the same device. Raises strata::user_error when no CUDA device is
// visible, the index is out of range, or another device was initialised before.
void init_cuda(int device = 0);
// The CUDA backend's compute stream (a cudaStream_t; Note [CUDA streams]), for launchers outside
// tensor/ that must run in order with the ops (optim's fused AdamW). Initialises device 0 first
// if no device was initialised, with init_cuda's errors (a UserError without a GPU or a build
// without CUDA).
void* cuda_current_stream();

// What a device says of itself, from which runtime::device_peaks (runtime/device_peaks.h)
// derives its peak FLOP/s and memory bandwidth. A field the driver does not report stays 0.
// Raises init_cuda's errors when the build has no CUDA backend or `device` is not visible.
struct CudaDeviceFacts {
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;  // compute capability
  int sms = 0;               // streaming multiprocessors
  int clock_khz = 0;         // the SMs' peak clock
  int memory_clock_khz = 0;  // the memory's peak clock
  int bus_width_bits = 0;    // the memory bus
  int64_t total_bytes = 0;   // device memory
};
CudaDeviceFacts cuda_device_facts(int device = 0);

// cuBLASLt algorithm tuning (Note [cuBLASLt tuning] in tensor/cuda/matmul_tuning.cpp). Off (the
// default), each matmul problem runs the algorithm cuBLASLt's heuristic ranks first. On, each new
// problem times up to 8 of the heuristic's algorithms on its own operands and keeps the fastest.
// `file`, when not empty, records every choice and is read before anything is timed, so a rerun or
// a resume with the same file makes the same choices and gives the same bits; a file that cannot
// be read, parsed or written is a UserError naming it, raised by the first matmul that needs it.
// Forgets the choices made so far in this process.
// Binaries that never call this take STRATA_MATMUL_TUNE (off | on) and STRATA_MATMUL_TUNE_FILE
// from the environment. Raises init_cuda's errors where the build has no CUDA backend and `on`.
void set_cuda_matmul_tuning(bool on, const std::string& file = "");
// Note [TF32]
// TF32 is the tensor cores' f32 format: f32's 8 exponent bits and 10 of its 23 fraction bits, so
// an input keeps about 3 decimal digits (a relative rounding error up to 2^-11, 2^-10 where the
// hardware truncates) while products are summed in f32. On (set_cuda_tf32(true); `train`'s
// run.tf32: on; bench_gpt2_cuda --tf32), every f32 GEMM on the GPU (matmul, linear and their
// gradients) asks cuBLASLt for CUBLAS_COMPUTE_32F_FAST_TF32: the tensor cores' TF32 rate (494.7
// dense TFLOP/s on an H100 SXM, against 66.9 for f32 on the CUDA cores) at that precision, what
// PyTorch's torch.backends.cuda.matmul.allow_tf32 = True does. Off (the default, as in PyTorch),
// f32 GEMMs compute in full f32 and match the CPU backend within f32 rounding. bf16/f16 GEMMs,
// attention and every other kernel are the same either way, and the CPU backend ignores it.
// TF32 GEMMs are as deterministic as f32 ones (the same algorithm gives the same bits), and their
// algorithms are chosen and tuned apart from f32 ones (Note [cuBLASLt tuning]). Raises
// init_cuda's errors where the build has no CUDA backend and `on`.
void set_cuda_tf32(bool on);
bool cuda_tf32();  // false without CUDA
// One choice of tuning: `problem` in words, the candidate kept (0 = the heuristic's first) of
// `candidates`, their timed milliseconds (0 when read from the file) and whether it came from the
// file.
struct CudaMatmulChoice {
  std::string problem;
  int chosen = 0;
  int candidates = 0;
  double ms = 0, first_ms = 0;
  bool from_file = false;
};
// The choices tuning made since the last set_cuda_matmul_tuning (empty without CUDA).
std::vector<CudaMatmulChoice> cuda_matmul_choices();
// While one lives, a matmul problem tuning has not met yet runs the heuristic's first algorithm
// and is neither timed nor recorded (problems tuned before keep their algorithm). For work whose
// every call is a new shape, like sampling, which grows its sequence by a token per forward.
class CudaMatmulTuningPause {
 public:
  CudaMatmulTuningPause();
  ~CudaMatmulTuningPause();
  CudaMatmulTuningPause(const CudaMatmulTuningPause&) = delete;
  CudaMatmulTuningPause& operator=(const CudaMatmulTuningPause&) = delete;
};

// Per-op device time (Note [CUDA op profiler] in tensor/cuda/profiler.cpp). cuda_profile_start
// clears the totals and starts timing every CUDA backend op; cuda_profile_stop waits for the
// timed work and returns one row per op name, longest total first. In a build without CUDA they
// do nothing and return no rows.
struct CudaOpTime {
  std::string op;     // the backend op, e.g. "matmul", "attention_backward[cudnn]", "adamw"
  int64_t calls = 0;  // times it ran while profiling
  double ms = 0;      // device milliseconds over those calls
  double flops = 0;   // floating-point operations they computed (0 for memory-bound ops)
  double bytes = 0;   // bytes of their operands (read and written)
};
void cuda_profile_start();
std::vector<CudaOpTime> cuda_profile_stop();

// Times the device work enqueued on cuda_current_stream() during its life as op `op`, for
// launchers outside tensor/ (optim's fused AdamW); nothing while profiling is off.
class CudaProfileScope {
 public:
  explicit CudaProfileScope(const char* op, double flops = 0.0, double bytes = 0.0);
  ~CudaProfileScope();
  CudaProfileScope(const CudaProfileScope&) = delete;
  CudaProfileScope& operator=(const CudaProfileScope&) = delete;

 private:
  void* impl_ = nullptr;
};

}  // namespace strata::tensor
