#pragma once
// What every Communicator backend shares: the words its messages use, the argument checks every
// op makes before it is queued (so a mistake raises at the call, not later in wait()), and a Work
// that is finished from the start.
#include <chrono>
#include <exception>
#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace strata::comm::detail {

// "communicator 'dp' (mpi, rank 1 of 4)"
std::string describe(const Communicator& comm);
// "allreduce of 4096 f32"
std::string describe_op(std::string_view op, const tensor::Tensor& t);
std::string_view reduce_op_name(ReduceOp op);
// "30 s", "1500 ms"
std::string format_duration(std::chrono::milliseconds d);

// Every tensor handed to a collective: defined, contiguous and on a device the backend serves
// (CPU always; CUDA when `allow_cuda`).
// `role` names the tensor in messages: "tensor", "input tensor", "output tensor".
void check_tensor(const Communicator& comm, std::string_view op, std::string_view role,
                  const tensor::Tensor& t, bool allow_cuda);
// Reductions: the dtype is one the backend can add (F32, I32, I64; `allow_half` adds BF16, F16).
void check_reducible(const Communicator& comm, std::string_view op, const tensor::Tensor& t,
                     bool allow_half);
// input.numel() == size * output.numel() (reduce_scatter) or the reverse (allgather); same dtype
// and device.
void check_scatter_shapes(const Communicator& comm, std::string_view op,
                          const tensor::Tensor& whole, const tensor::Tensor& chunk);
void check_peer(const Communicator& comm, std::string_view op, int peer, int tag);
void check_root(const Communicator& comm, int root);

// True when `chunk` is exactly elements [index * chunk.numel(), (index + 1) * chunk.numel()) of
// the contiguous `whole` (the in-place allgather case).
bool is_chunk_of(const tensor::Tensor& chunk, const tensor::Tensor& whole, int64_t index);
// True when the two tensors' bytes overlap.
bool overlaps(const tensor::Tensor& a, const tensor::Tensor& b);

// A Work that finished when it was made; wait() rethrows `error` if there is one.
class DoneWork final : public Work {
 public:
  explicit DoneWork(std::exception_ptr error = nullptr) : error_(std::move(error)) {}
  void wait() override {
    if (error_) std::rethrow_exception(error_);
  }
  bool done() const override { return true; }

 private:
  std::exception_ptr error_;
};

}  // namespace strata::comm::detail
