#include "comm/nccl_communicator.h"

#include "core/error.h"

#if STRATA_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/comm_common.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"

namespace strata::comm {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    user_error("{} failed: CUDA error {}: {}", what, static_cast<int>(rc), cudaGetErrorString(rc));
}

// True once the event's work has finished. cudaErrorNotReady is also left as this thread's last
// error, which the next launch check would report as a failure: cleared here. Another error is
// "not done" too: the watchdog's timeout and ncclCommGetAsyncError report what went wrong.
bool event_done(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) cudaGetLastError();
  return r == cudaSuccess;
}

// Reductions use the element type; ops that only move data move bytes, so every dtype moves.
ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U16:
    case DType::U8:
      break;
  }
  STRATA_UNREACHABLE("{} does not reduce (check_reducible)", dtype_name(d));
}

// NCCL's description of the last error (empty before NCCL 2.13). `comm` may be null, as before
// ncclCommInitRank succeeded: NCCL keeps the message per process, not per communicator.
const char* last_error(ncclComm_t comm) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  return ncclGetLastError(comm);
#else
  return "";
#endif
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  STRATA_UNREACHABLE();
}

// One issued op: its events and the tensors it reads or writes, kept alive until it completed
// (so a tensor dropped before wait() is not handed to the compute stream while NCCL uses it).
struct OpRecord {
  std::string what;
  cudaEvent_t start = nullptr, done = nullptr;
  std::vector<tensor::Tensor> keep;
  std::optional<Clock::time_point> started_at;  // when the host first saw `start` complete
  bool completed = false;
};

// What the communicator and its Work handles share (Note [NCCL streams]).
struct NcclState {
  std::mutex mu;  // guards everything below
  ncclComm_t comm = nullptr;
  bool aborted = false;
  std::string label;  // "communicator 'dp' (nccl, rank 1 of 4)"
  std::chrono::milliseconds timeout{0};
  std::deque<std::shared_ptr<OpRecord>> inflight;  // issue order
  std::string failure;  // set once an op timed out or NCCL failed: the communicator is dead

  ~NcclState() {
    for (auto& op : inflight) release(*op);
  }

  static void release(OpRecord& op) {
    if (op.start) cudaEventDestroy(op.start);
    if (op.done) cudaEventDestroy(op.done);
    op.start = op.done = nullptr;
    op.keep.clear();
  }

  // With `mu` held: retires completed ops from the front and notes when the oldest incomplete
  // op started on the GPU.
  void poll() {
    while (!inflight.empty()) {
      OpRecord& op = *inflight.front();
      if (event_done(op.done)) {
        op.completed = true;
        release(op);
        inflight.pop_front();
        continue;
      }
      if (!op.started_at && event_done(op.start)) op.started_at = Clock::now();
      return;
    }
  }

  // With `mu` held: raises (after aborting the NCCL communicator, which frees the stream) when
  // the running op exceeded the timeout or NCCL reported an asynchronous error.
  void check_health() {
    if (!failure.empty()) throw UserError(failure);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      fail(fmt::format("{}: NCCL failed: {} ({})", label, ncclGetErrorString(async),
                       last_error(comm)));
    }
    if (!inflight.empty()) {
      const OpRecord& op = *inflight.front();
      // Timed from when the op started on the GPU: waiting behind slow compute is not a hang.
      if (op.started_at && Clock::now() - *op.started_at >= timeout) {
        fail(fmt::format("{}: {} did not finish within {}; a peer rank has probably died or hangs",
                         label, op.what, detail::format_duration(timeout)));
      }
    }
  }

  [[noreturn]] void fail(std::string msg) {
    failure = std::move(msg);
    if (!aborted) {
      ncclCommAbort(comm);  // ends the stuck kernels; the communicator is gone
      aborted = true;
    }
    throw UserError(failure);
  }
};

// Blocks until `op` completed, polling so the watchdog can fire (Note [Failed ranks]).
void wait_op(NcclState& st, const OpRecord& op) {
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard lk(st.mu);
      if (op.completed) return;
      st.poll();
      if (op.completed) return;
      st.check_health();
    }
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> st, std::shared_ptr<OpRecord> op)
      : st_(std::move(st)), op_(std::move(op)) {}
  void wait() override { wait_op(*st_, *op_); }
  bool done() const override {
    std::lock_guard lk(st_->mu);
    st_->poll();
    return op_->completed;
  }

 private:
  std::shared_ptr<NcclState> st_;
  std::shared_ptr<OpRecord> op_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, Device device, std::string name,
                   std::chrono::milliseconds timeout)
      : bootstrap_(std::move(bootstrap)),
        device_(device),
        name_(std::move(name)),
        st_(std::make_shared<NcclState>()) {
    rank_ = bootstrap_->rank();
    size_ = bootstrap_->size();
    tensor::init_cuda(device_.index);
    auto* backend = dynamic_cast<tensor::cuda::CudaBackend*>(&tensor::backend_for(device_));
    STRATA_CHECK(backend != nullptr, "the backend of {} is not the CUDA backend", device_.str());
    compute_ = backend->stream();
    check_cuda(cudaSetDevice(device_.index), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");

    try {
      // Rank 0 makes the id; the bootstrap communicator carries it to the others.
      ncclUniqueId id{};
      if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      tensor::Tensor id_bytes =
          tensor::Tensor::from_blob(&id, {static_cast<int64_t>(sizeof(id))}, DType::U8);
      bootstrap_->broadcast(id_bytes, 0)->wait();
      check_nccl(ncclCommInitRank(&st_->comm, size_, id, rank_), "ncclCommInitRank");
    } catch (...) {
      // No destructor runs for a constructor that throws (a refused communicator, e.g. two
      // ranks on one GPU, may be caught and the process go on).
      cudaEventDestroy(ready_);
      cudaStreamDestroy(stream_);
      throw;
    }
    st_->label = detail::describe(*this);
    st_->timeout = timeout;
  }

  ~NcclCommunicator() override {
    try {
      synchronize();
    } catch (const Error&) {
      // Already aborted by the watchdog; nothing more can be done here.
    }
    std::lock_guard lk(st_->mu);
    if (!st_->aborted) ncclCommDestroy(st_->comm);
    st_->aborted = true;
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  const std::string& name() const override { return name_; }

  WorkHandle allreduce(tensor::Tensor t, ReduceOp op) override {
    check(t, "allreduce", "tensor");
    detail::check_reducible(*this, "allreduce", t, /*allow_half=*/true);
    return issue(detail::describe_op("allreduce", t), {t}, [&](ncclComm_t c) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), nccl_op(op),
                           c, stream_);
    });
  }

  WorkHandle reduce_scatter(tensor::Tensor input, tensor::Tensor output, ReduceOp op) override {
    check(input, "reduce_scatter", "input tensor");
    check(output, "reduce_scatter", "output tensor");
    detail::check_reducible(*this, "reduce_scatter", input, true);
    detail::check_scatter_shapes(*this, "reduce_scatter", input, output);
    // NCCL's in-place form is the output at this rank's chunk of the input; any other overlap
    // goes through a temporary on the communication stream.
    const bool overlap =
        detail::overlaps(input, output) && !detail::is_chunk_of(output, input, rank_);
    tensor::Tensor out =
        overlap ? tensor::Tensor::empty(output.shape(), output.dtype(), device_) : output;
    return issue(
        detail::describe_op("reduce_scatter", input), {input, output, out}, [&](ncclComm_t c) {
          ncclResult_t r = ncclReduceScatter(input.data_ptr(), out.data_ptr(), out.numel(),
                                             nccl_type(input.dtype()), nccl_op(op), c, stream_);
          if (r == ncclSuccess && overlap) {
            check_cuda(cudaMemcpyAsync(output.data_ptr(), out.data_ptr(), out.nbytes(),
                                       cudaMemcpyDeviceToDevice, stream_),
                       "cudaMemcpyAsync");
          }
          return r;
        });
  }

  WorkHandle allgather(tensor::Tensor input, tensor::Tensor output) override {
    check(input, "allgather", "input tensor");
    check(output, "allgather", "output tensor");
    detail::check_scatter_shapes(*this, "allgather", output, input);
    STRATA_USER_CHECK(detail::is_chunk_of(input, output, rank_) || !detail::overlaps(input, output),
                      "{}: allgather input {} overlaps the output {} but is not its chunk {}; "
                      "pass that chunk or a separate tensor",
                      detail::describe(*this), input.str(), output.str(), rank_);
    return issue(detail::describe_op("allgather", input), {input, output}, [&](ncclComm_t c) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, c,
                           stream_);
    });
  }

  WorkHandle broadcast(tensor::Tensor t, int root) override {
    check(t, "broadcast", "tensor");
    detail::check_root(*this, root);
    return issue(fmt::format("{} from rank {}", detail::describe_op("broadcast", t), root), {t},
                 [&](ncclComm_t c) {
                   return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, c,
                                        stream_);
                 });
  }

  // NCCL matches point-to-point by order between a pair of ranks, not by tag: `tag` is only
  // validated and named in messages.
  WorkHandle send(tensor::Tensor t, int peer, int tag) override {
    check(t, "send", "tensor");
    detail::check_peer(*this, "send", peer, tag);
    return issue(fmt::format("{} to rank {}", detail::describe_op("send", t), peer), {t},
                 [&](ncclComm_t c) {
                   return ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, c, stream_);
                 });
  }

  WorkHandle recv(tensor::Tensor t, int peer, int tag) override {
    check(t, "recv", "tensor");
    detail::check_peer(*this, "recv", peer, tag);
    return issue(fmt::format("{} from rank {}", detail::describe_op("recv", t), peer), {t},
                 [&](ncclComm_t c) {
                   return ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, peer, c, stream_);
                 });
  }

  void barrier() override {
    synchronize();
    bootstrap_->barrier();
  }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    synchronize();
    std::shared_ptr<Communicator> child = bootstrap_->split(color, key, name + "-bootstrap");
    if (!child) return nullptr;
    std::chrono::milliseconds timeout;
    {
      std::lock_guard lk(st_->mu);
      timeout = st_->timeout;
    }
    return std::make_unique<NcclCommunicator>(std::move(child), device_, std::move(name), timeout);
  }

  void set_timeout(std::chrono::milliseconds timeout) override {
    STRATA_USER_CHECK(timeout.count() > 0, "{}: timeout must be positive, got {} ms",
                      detail::describe(*this), timeout.count());
    {
      std::lock_guard lk(st_->mu);
      st_->timeout = timeout;
    }
    bootstrap_->set_timeout(timeout);
  }

 private:
  void check(const tensor::Tensor& t, std::string_view op, std::string_view role) const {
    detail::check_tensor(*this, op, role, t, /*allow_cuda=*/true);
    STRATA_USER_CHECK(t.device() == device_,
                      "{}: {} got {} {} on {}; the nccl backend moves memory of {} only",
                      detail::describe(*this), op, role.starts_with("i") ? "an" : "a", role,
                      t.device().str(), device_.str());
  }

  void check_nccl(ncclResult_t r, std::string_view what) const {
    if (r == ncclSuccess) return;
    user_error("communicator '{}' (nccl, rank {} of {}): {} failed: {} ({})", name_, rank_, size_,
               what, ncclGetErrorString(r), last_error(st_->comm));
  }

  // Note [NCCL streams]: the comm stream waits for the compute stream, then runs `launch`.
  template <typename Launch>
  WorkHandle issue(std::string what, std::vector<tensor::Tensor> keep, Launch&& launch) {
    std::lock_guard lk(st_->mu);
    if (!st_->failure.empty()) {
      user_error("{}: {} issued after an earlier failure: {}", st_->label, what, st_->failure);
    }
    // cudaSetDevice is per thread; the issuing thread need not be the one that initialised CUDA.
    check_cuda(cudaSetDevice(device_.index), "cudaSetDevice");
    auto op = std::make_shared<OpRecord>();
    op->what = std::move(what);
    op->keep = std::move(keep);
    check_cuda(cudaEventCreateWithFlags(&op->start, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready_, compute_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    check_cuda(cudaEventRecord(op->start, stream_), "cudaEventRecord");
    const ncclResult_t r = launch(st_->comm);
    if (r != ncclSuccess) {
      NcclState::release(*op);
      check_nccl(r, op->what);
    }
    check_cuda(cudaEventRecord(op->done, stream_), "cudaEventRecord");
    st_->poll();  // retire what finished meanwhile, so `inflight` stays short
    st_->inflight.push_back(op);
    return std::make_shared<NcclWork>(st_, std::move(op));
  }

  // Waits for every issued op (with the watchdog).
  void synchronize() {
    std::shared_ptr<OpRecord> last;
    {
      std::lock_guard lk(st_->mu);
      if (!st_->failure.empty()) throw UserError(st_->failure);
      if (!st_->inflight.empty()) last = st_->inflight.back();
    }
    if (last) wait_op(*st_, *last);
  }

  std::shared_ptr<Communicator> bootstrap_;
  Device device_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::shared_ptr<NcclState> st_;
};

}  // namespace

bool nccl_built() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap,
                                                     Device device, std::string name,
                                                     std::chrono::milliseconds timeout) {
  STRATA_CHECK(bootstrap != nullptr, "make_nccl_communicator needs a bootstrap communicator");
  STRATA_USER_CHECK(device.is_cuda(),
                    "backend 'nccl' moves GPU memory, but the device is {}; use device: cuda or "
                    "backend mpi",
                    device.str());
  STRATA_USER_CHECK(tensor::cuda_available(),
                    "backend 'nccl' needs a GPU, but none is visible to this process; check "
                    "nvidia-smi and CUDA_VISIBLE_DEVICES, or use backend mpi");
  STRATA_USER_CHECK(timeout.count() > 0, "communicator timeout must be positive, got {} ms",
                    timeout.count());
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device, std::move(name), timeout);
}

}  // namespace strata::comm

#else  // !STRATA_HAVE_NCCL

namespace strata::comm {

bool nccl_built() {
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, Device,
                                                     std::string, std::chrono::milliseconds) {
  user_error(
      "backend 'nccl' was asked for, but this Strata build has no NCCL: build with the CUDA "
      "toolkit and NCCL (nccl.h and libnccl next to it), or use backend mpi");
}

}  // namespace strata::comm

#endif
