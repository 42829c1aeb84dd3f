#pragma once
// The CUDA backend. Host code (C++20) that validates, allocates scratch and calls the kernel
// launchers of kernels.h; methods are implemented across files by topic, as tensor/cpu/ does:
//   cuda_backend.cpp    device setup, registration, memory, streams, copies (incl. host <-> device)
//   copy_fill.cpp       fill, arange, random draws, concat
//   elementwise.cpp     binary, affine, axpy, unary(+backward), bias_add, dropout, rotary
//   reduce.cpp          sum_to, reduce, top_k, sum_squares(_many), scale_unless_equal
//   matmul.cpp          matmul through cuBLASLt (fp32 accumulate; matmul.h, matmul_tuning.cpp)
//   linear.cpp          linear with cuBLASLt epilogues and its backward pieces
//   norm.cpp            layernorm, rmsnorm (also fused with a residual add), softmax
//   attention.cpp       attention (cuDNN, else the own kernels)
//   embedding_loss.cpp  embedding, cross-entropy
// The kernels are in the .cu files of the same names (norm.cu and softmax.cu for norm.cpp;
// attention_tc.cu, attention_decode.cu and top_k.cu besides); backend_util.h holds the host
// helpers the files share.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "offload/gpu_allocator.h"
#include "tensor/backend.h"

struct CUstream_st;
struct CUevent_st;
struct cublasLtContext;

namespace strata::tensor::cuda {

// Note [CUDA streams]
// All ops of a backend run in order on one compute stream (created non-blocking, so the legacy
// default stream does not serialise it against other streams). Copies to the host wait for that
// stream, because the host reads the result at once. Copies from the host do not wait (Note
// [Pinned staging]). Communication and
// prefetch streams (parallel/, offload/) order themselves against the compute stream with
// events, and tell the allocator (GpuCachingAllocator::record_stream) when they use a block.
//
// Note [Pinned staging]
// The caller of copy() may free or reuse its host buffer as soon as copy() returns, so a
// host-to-device copy straight from pageable memory would have to wait for the stream. Instead
// copy_from_host copies the bytes into one of a few pinned buffers, enqueues the DMA from it and
// records an event; a buffer is reused only after its event, four copies later. So
// the batch copies of a training step, and the embedding backward's id lists, never stall the
// GPU. Copies above kPinnedStagingMax (checkpoint loads) go straight across and wait. The pinned
// buffers grow to the largest copy seen (at least 64 KiB each) and live as long as the backend.
//
// Note [Deferred device checks]
// A kernel that finds bad input (a token id outside the vocabulary, a target outside the
// classes) must not make the host wait to find out: those waits, several per micro-batch, each
// left the GPU idle. Instead each such launch takes its own flag (checked_launch(message)) in
// pinned host memory mapped into the device; the kernel stays in bounds (it skips or zeroes what
// it cannot compute) and sets its flag, and the host looks at the flags after every wait for the
// compute stream (synchronize(), so after every copy to the host as well): a set flag raises the
// UserError with that launch's message and clears them all. A training step waits at least once
// (the gradient norm, the loss it logs), so bad data is reported in the step that used it, and
// the data loader has already checked every token on the host (data/data_loader.cpp).
// With kDeviceChecks launches pending, the next checked launch waits first.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  Device device() const override { return Device::cuda(device_); }
  CUstream_st* stream() const { return stream_; }
  offload::GpuCachingAllocator& allocator() { return *allocator_; }
  // Waits until every op queued so far has finished (benchmarks, tests).
  void synchronize();

  void copy(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& dst, double value) override;
  void arange(Tensor& dst, double start, double step) override;
  void random_uniform(Tensor& dst, RngKey key, float lo, float hi) override;
  void random_normal(Tensor& dst, RngKey key, float mean, float stddev) override;
  void concat(const std::vector<Tensor>& xs, int dim, Tensor& out) override;

  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void affine(const Tensor& x, float alpha, float beta, Tensor& out) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void unary(UnaryOp op, const Tensor& x, Tensor& out) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void bias_add(const Tensor& x, const Tensor& bias, Tensor& out) override;
  void dropout(const Tensor& x, float p, RngKey key, Tensor& out) override;

  void sum_to(const Tensor& x, Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) override;
  void top_k(const Tensor& x, Tensor& values, Tensor& indices) override;
  double sum_squares(const Tensor& x) override;
  std::vector<double> sum_squares_many(const std::vector<Tensor>& xs) override;

  void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
              float alpha, float beta) override;

  void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                      Tensor& y, Tensor& pre) override;
  void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dweight, Tensor& dbias,
                              bool accumulate) override;
  void linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre, Tensor& dpre,
                            Tensor& dbias) override;

  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias, bool accumulate) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                       Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        Tensor& dx, Tensor& dweight, bool accumulate) override;
  void add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                             const Tensor& bias, float eps, Tensor& s, Tensor& y, Tensor& mean,
                             Tensor& rstd) override;
  void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              Tensor& dsum, Tensor& dweight, Tensor& dbias,
                              bool accumulate) override;
  void add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                           Tensor& s, Tensor& y, Tensor& rstd) override;
  void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                            const Tensor& weight, const Tensor& rstd, Tensor& dsum, Tensor& dweight,
                            bool accumulate) override;
  void softmax_forward(const Tensor& x, Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;

  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& out, Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, bool causal, float scale,
                          Tensor& dq, Tensor& dk, Tensor& dv) override;
  void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
              Tensor& out) override;

  void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             int64_t classes, Tensor& losses, Tensor& lse) override;
  void cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index, int64_t classes,
                              Tensor& dlogits) override;
  void cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           int64_t classes, float grad, const Tensor& norm, Tensor& losses,
                           Tensor& lse) override;
  void scale_unless_equal(Tensor& x, const Tensor& g, float expected) override;

 private:
  void copy_on_device(const Tensor& src, Tensor& dst);
  Tensor scratch(int64_t bytes);  // workspace bytes on this device
  int multiprocessors();          // this device's, asked once
  // Note [Deferred device checks]: the device pointer of a fresh flag for one launch.
  int* checked_launch(std::string message);
  void raise_device_checks();
  // Note [Pinned staging]: enqueues dst (device) <- src (host) on the compute stream.
  void copy_from_host(const void* src, void* dst, size_t bytes);

  static constexpr size_t kPinnedStagingMax = size_t{64} << 20;
  struct PinnedSlot {
    void* ptr = nullptr;
    size_t bytes = 0;
    CUevent_st* done = nullptr;
  };
  std::array<PinnedSlot, 4> pinned_{};
  int next_pinned_ = 0;
  static constexpr int kDeviceChecks = 64;
  int* check_flags_ = nullptr;      // pinned and mapped: the host's view
  int* check_flags_dev_ = nullptr;  // the device's view of the same ints
  std::mutex checks_mu_;  // the slots and messages (ops are issued from one thread, but be safe)
  int checks_used_ = 0;
  std::array<std::string, kDeviceChecks> check_messages_;

  int device_;
  int sms_ = 0;  // multiprocessors(), 0 until asked
  CUstream_st* stream_ = nullptr;
  cublasLtContext* lt_ = nullptr;
  offload::GpuCachingAllocator* allocator_ = nullptr;  // owned by the registry (never freed)
  Tensor matmul_workspace_;
};

// Aborts with an InternalError naming the call when a CUDA runtime call failed.
void check_cuda(int status, const char* what);

// cudaEventQuery as a bool: true when the work before the event's record has finished. A
// cudaErrorNotReady answer is also left as the host thread's last error, where the next
// cudaGetLastError (the launch check after a kernel) would report it as a failure; this clears
// it. Other errors throw as check_cuda does.
bool event_completed(CUevent_st* event, const char* what);

}  // namespace strata::tensor::cuda
