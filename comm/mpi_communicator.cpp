#include "comm/mpi_communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "core/logging.h"
#include "comm/comm_common.h"

#if STRATA_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "offload/pinned_allocator.h"
#include "comm/mpi_engine.h"
#include "tensor/storage.h"

namespace strata::comm {

namespace {

using detail::mpi_error_string;
using detail::mpi_lock;
using detail::mpi_runtime;
using detail::MpiEngine;
using detail::MpiOpResult;
using Engine = MpiEngine;

// Counts handed to one MPI call stay below INT_MAX; longer tensors go in pieces.
constexpr int64_t kMaxCount = int64_t{1} << 30;

// Every dtype moves (bf16/f16 as 16-bit words). F32, I32 and I64 reduce with MPI's own ops;
// BF16 and F16 with the user-defined ops below (Note [Half-precision MPI reductions]).
MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      return MPI_UINT16_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  STRATA_UNREACHABLE("dtype {}", static_cast<int>(d));
}

// Note [Half-precision MPI reductions]
// MPI has no bf16/f16 types, so they travel as 16-bit words and reduce through MPI_Op_create'd
// functions: widen both operands to f32, combine, round to nearest even once (core/half.h) —
// what NCCL does for its bf16/f16 sums. The ops are created right after MPI_Init_thread, before
// any communication thread exists, and marked commutative; the order MPI applies them in is
// fixed for a given communicator size and message size, so results repeat bit for bit.
template <typename H, int kOp>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = H::to_float(a[i]), y = H::to_float(b[i]);
    const float r = kOp == 0 ? x + y : kOp == 1 ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = H::from_float(r);
  }
}

MPI_Op g_half_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                           {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};  // [bf16, f16][sum, max, min]

void create_half_ops() {
  if (g_half_ops[0][0] != MPI_OP_NULL) return;
  MPI_Op_create(&half_reduce<BFloat16, 0>, 1, &g_half_ops[0][0]);
  MPI_Op_create(&half_reduce<BFloat16, 1>, 1, &g_half_ops[0][1]);
  MPI_Op_create(&half_reduce<BFloat16, 2>, 1, &g_half_ops[0][2]);
  MPI_Op_create(&half_reduce<Float16, 0>, 1, &g_half_ops[1][0]);
  MPI_Op_create(&half_reduce<Float16, 1>, 1, &g_half_ops[1][1]);
  MPI_Op_create(&half_reduce<Float16, 2>, 1, &g_half_ops[1][2]);
}

int op_index(ReduceOp op) {
  return op == ReduceOp::Sum ? 0 : op == ReduceOp::Max ? 1 : 2;
}

MPI_Op mpi_op(ReduceOp op, DType d) {
  if (d == DType::BF16 || d == DType::F16) {
    const MPI_Op h = g_half_ops[d == DType::BF16 ? 0 : 1][op_index(op)];
    STRATA_CHECK(h != MPI_OP_NULL, "half-precision MPI ops used before MPI was initialised");
    return h;
  }
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  STRATA_UNREACHABLE("reduce op {}", static_cast<int>(op));
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Engine> engine, uint64_t seq, std::shared_ptr<MpiOpResult> result)
      : engine_(std::move(engine)), seq_(seq), result_(std::move(result)) {}
  void wait() override {
    engine_->wait(seq_);
    if (result_->error) std::rethrow_exception(result_->error);
    std::call_once(result_->finished, [&] {
      if (result_->finish) result_->finish();
    });
  }
  bool done() const override { return engine_->done(seq_); }

 private:
  std::shared_ptr<Engine> engine_;
  uint64_t seq_;
  std::shared_ptr<MpiOpResult> result_;
};

// " (the group holds world ranks 0, 2, 4, 6)" for a group smaller than the world; "" otherwise.
std::string world_members(MPI_Comm comm, int size) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (size == world_size) return "";
  MPI_Group group, world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> ranks(size), world_ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  MPI_Group_translate_ranks(group, size, ranks.data(), world_group, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  const int shown = std::min(size, 16);
  std::string list =
      fmt::format("{}", fmt::join(world_ranks.begin(), world_ranks.begin() + shown, ", "));
  if (shown < size) list += ", ...";
  return fmt::format(" (the group holds world ranks {})", list);
}

// Host copies of GPU tensors come from a pool of pinned buffers (Note [Pinned pool]): the GPU
// copies them at full speed, and the same bucket sizes are reused step after step. Charged to
// Category::Comm while in use. Leaked on purpose, like the runtime.
offload::PinnedAllocator& staging_allocator() {
  static auto* a = new offload::PinnedAllocator();
  return *a;
}

// Where an op's data lives while MPI works on it: the tensor itself on the CPU; for a GPU tensor,
// a pinned host buffer (filled now when the op reads it).
tensor::Tensor host_buffer(const tensor::Tensor& t, bool read) {
  if (t.device().is_cpu()) return t;
  auto storage = std::make_shared<tensor::Storage>(t.nbytes(), Device::cpu(), &staging_allocator(),
                                                   offload::Category::Comm);
  tensor::Tensor host(std::move(storage), t.shape(), t.shape().contiguous_strides(), 0, t.dtype());
  if (read) host.copy_(t);
  return host;
}

char* bytes(const tensor::Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`.
  MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {
    {
      auto ml = mpi_lock();
      MPI_Comm_rank(comm, &rank_);
      MPI_Comm_size(comm, &size_);
    }
    std::string members;
    {
      auto ml = mpi_lock();
      members = world_members(comm, size_);
    }
    engine_ = std::make_shared<Engine>(comm, detail::describe(*this), std::move(members), timeout);
    engine_->start();
  }
  ~MpiCommunicator() override { engine_->close(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  const std::string& name() const override { return name_; }

  WorkHandle allreduce(tensor::Tensor t, ReduceOp op) override {
    detail::check_tensor(*this, "allreduce", "tensor", t, /*allow_cuda=*/true);
    detail::check_reducible(*this, "allreduce", t, /*allow_half=*/true);
    tensor::Tensor host = host_buffer(t, /*read=*/true);
    Engine* e = engine_.get();
    auto run = [e, host, op] {
      const MPI_Datatype type = mpi_type(host.dtype());
      const DType type_of = host.dtype();
      const size_t es = host.element_size();
      for (int64_t off = 0; off < host.numel(); off += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, host.numel() - off));
        void* p = bytes(host) + off * es;
        e->call(
            "MPI_Allreduce",
            [&] { return MPI_Allreduce(MPI_IN_PLACE, p, n, type, mpi_op(op, type_of), e->comm()); },
            [&](MPI_Request* r) {
              return MPI_Iallreduce(MPI_IN_PLACE, p, n, type, mpi_op(op, type_of), e->comm(), r);
            });
      }
    };
    return submit(detail::describe_op("allreduce", t), run, copy_back(t, host));
  }

  WorkHandle reduce_scatter(tensor::Tensor input, tensor::Tensor output, ReduceOp op) override {
    detail::check_tensor(*this, "reduce_scatter", "input tensor", input, true);
    detail::check_tensor(*this, "reduce_scatter", "output tensor", output, true);
    detail::check_reducible(*this, "reduce_scatter", input, /*allow_half=*/true);
    detail::check_scatter_shapes(*this, "reduce_scatter", input, output);
    check_count("reduce_scatter", output.numel());
    tensor::Tensor in = host_buffer(input, true);
    tensor::Tensor out = host_buffer(output, false);
    // MPI forbids aliased buffers; an output inside the input (e.g. this rank's shard of a flat
    // gradient) gets a temporary.
    tensor::Tensor result = out;
    if (detail::overlaps(in, out)) out = tensor::Tensor::empty(out.shape(), out.dtype());
    Engine* e = engine_.get();
    auto run = [e, in, out, result, op] {
      const int n = static_cast<int>(out.numel());
      const MPI_Datatype type = mpi_type(in.dtype());
      const DType type_of = in.dtype();
      e->call(
          "MPI_Reduce_scatter_block",
          [&] {
            return MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), n, type,
                                            mpi_op(op, type_of), e->comm());
          },
          [&](MPI_Request* r) {
            return MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), n, type,
                                             mpi_op(op, type_of), e->comm(), r);
          });
      if (!out.is_same(result)) std::memcpy(result.data_ptr(), out.data_ptr(), out.nbytes());
    };
    return submit(detail::describe_op("reduce_scatter", input), run, copy_back(output, result));
  }

  WorkHandle allgather(tensor::Tensor input, tensor::Tensor output) override {
    detail::check_tensor(*this, "allgather", "input tensor", input, true);
    detail::check_tensor(*this, "allgather", "output tensor", output, true);
    detail::check_scatter_shapes(*this, "allgather", output, input);
    check_count("allgather", input.numel());
    const bool in_place = detail::is_chunk_of(input, output, rank_);
    STRATA_USER_CHECK(in_place || !detail::overlaps(input, output),
                      "{}: allgather input {} overlaps the output {} but is not its chunk {} "
                      "(elements [{}, {})); pass that chunk or a separate tensor",
                      detail::describe(*this), input.str(), output.str(), rank_,
                      rank_ * input.numel(), (rank_ + 1) * input.numel());
    const bool cuda = !output.device().is_cpu();
    tensor::Tensor in = host_buffer(input, true);
    tensor::Tensor out = host_buffer(output, false);
    Engine* e = engine_.get();
    // A staged GPU output is a fresh host tensor, so only a CPU output can be gathered in place.
    const bool mpi_in_place = in_place && !cuda;
    auto run = [e, in, out, mpi_in_place] {
      const int n = static_cast<int>(in.numel());
      const MPI_Datatype type = mpi_type(in.dtype());
      const void* src = mpi_in_place ? MPI_IN_PLACE : in.data_ptr();
      e->call(
          "MPI_Allgather",
          [&] { return MPI_Allgather(src, n, type, out.data_ptr(), n, type, e->comm()); },
          [&](MPI_Request* r) {
            return MPI_Iallgather(src, n, type, out.data_ptr(), n, type, e->comm(), r);
          });
    };
    return submit(detail::describe_op("allgather", input), run, copy_back(output, out));
  }

  WorkHandle broadcast(tensor::Tensor t, int root) override {
    detail::check_tensor(*this, "broadcast", "tensor", t, true);
    detail::check_root(*this, root);
    tensor::Tensor host = host_buffer(t, /*read=*/rank_ == root);
    Engine* e = engine_.get();
    auto run = [e, host, root] {
      const MPI_Datatype type = mpi_type(host.dtype());
      for (int64_t off = 0; off < host.numel(); off += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, host.numel() - off));
        void* p = bytes(host) + off * host.element_size();
        e->call(
            "MPI_Bcast", [&] { return MPI_Bcast(p, n, type, root, e->comm()); },
            [&](MPI_Request* r) { return MPI_Ibcast(p, n, type, root, e->comm(), r); });
      }
    };
    return submit(fmt::format("{} from rank {}", detail::describe_op("broadcast", t), root), run,
                  copy_back(t, host));
  }

  WorkHandle send(tensor::Tensor t, int peer, int tag) override {
    detail::check_tensor(*this, "send", "tensor", t, true);
    detail::check_peer(*this, "send", peer, tag);
    tensor::Tensor host = host_buffer(t, true);
    Engine* e = engine_.get();
    auto run = [e, host, peer, tag] {
      const MPI_Datatype type = mpi_type(host.dtype());
      for (int64_t off = 0; off < host.numel(); off += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, host.numel() - off));
        void* p = bytes(host) + off * host.element_size();
        e->call(
            "MPI_Send", [&] { return MPI_Send(p, n, type, peer, tag, e->comm()); },
            [&](MPI_Request* r) { return MPI_Isend(p, n, type, peer, tag, e->comm(), r); });
      }
    };
    return submit(fmt::format("{} to rank {} (tag {})", detail::describe_op("send", t), peer, tag),
                  run, {});
  }

  WorkHandle recv(tensor::Tensor t, int peer, int tag) override {
    detail::check_tensor(*this, "recv", "tensor", t, true);
    detail::check_peer(*this, "recv", peer, tag);
    tensor::Tensor host = host_buffer(t, false);
    Engine* e = engine_.get();
    auto run = [e, host, peer, tag] {
      const MPI_Datatype type = mpi_type(host.dtype());
      for (int64_t off = 0; off < host.numel(); off += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, host.numel() - off));
        void* p = bytes(host) + off * host.element_size();
        e->call(
            "MPI_Recv",
            [&] { return MPI_Recv(p, n, type, peer, tag, e->comm(), MPI_STATUS_IGNORE); },
            [&](MPI_Request* r) { return MPI_Irecv(p, n, type, peer, tag, e->comm(), r); });
      }
    };
    return submit(
        fmt::format("{} from rank {} (tag {})", detail::describe_op("recv", t), peer, tag), run,
        copy_back(t, host));
  }

  void barrier() override {
    Engine* e = engine_.get();
    auto run = [e] {
      e->call(
          "MPI_Barrier", [&] { return MPI_Barrier(e->comm()); },
          [&](MPI_Request* r) { return MPI_Ibarrier(e->comm(), r); });
    };
    submit("barrier", run, {})->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    Engine* e = engine_.get();
    auto child = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    auto run = [e, color, key, child] {
      // MPI_Comm_split has no non-blocking form; in serialized mode a barrier polled first makes
      // every rank arrive, so the blocking split that follows holds the lock only briefly.
      if (mpi_runtime().serialized) {
        MPI_Request req = MPI_REQUEST_NULL;
        {
          auto ml = mpi_lock();
          e->check(MPI_Ibarrier(e->comm(), &req), "MPI_Ibarrier");
        }
        e->poll(req, "MPI_Ibarrier");
      }
      auto ml = mpi_lock();
      e->check(MPI_Comm_split(e->comm(), color < 0 ? MPI_UNDEFINED : color, key, child.get()),
               "MPI_Comm_split");
    };
    submit(fmt::format("split into '{}' (color {}, key {})", name, color, key), run, {})->wait();
    if (*child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(*child, std::move(name), timeout_);
  }

  void set_timeout(std::chrono::milliseconds timeout) override {
    STRATA_USER_CHECK(timeout.count() > 0, "{}: timeout must be positive, got {} ms",
                      detail::describe(*this), timeout.count());
    timeout_ = timeout;
    engine_->set_timeout(timeout);
  }

 private:
  void check_count(std::string_view op, int64_t n) const {
    STRATA_USER_CHECK(n < kMaxCount,
                      "{}: {} of {} elements per rank is more than the mpi backend moves in one "
                      "call ({}); split the tensor into smaller buckets",
                      detail::describe(*this), op, n, kMaxCount);
  }

  // The waiter's copy of a staged result back into the GPU tensor (nothing for CPU tensors).
  static std::function<void()> copy_back(tensor::Tensor dst, tensor::Tensor host) {
    if (dst.device().is_cpu()) return {};
    return [dst, host]() mutable { dst.copy_(host); };
  }

  WorkHandle submit(std::string what, std::function<void()> run, std::function<void()> finish) {
    STRATA_USER_CHECK(mpi_active(), "{}: {} issued after MPI was finalized (finalize_world)",
                      detail::describe(*this), what);
    auto result = std::make_shared<MpiOpResult>();
    result->finish = std::move(finish);
    const uint64_t seq = engine_->submit(std::move(what), std::move(run), result);
    return std::make_shared<MpiWork>(engine_, seq, std::move(result));
  }

  std::string name_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<Engine> engine_;
};

}  // namespace

bool mpi_built() {
  return true;
}

void mpi_init() {
  auto& rt = mpi_runtime();
  std::lock_guard lk(rt.mu);
  if (rt.initialized) return;
  STRATA_USER_CHECK(!rt.finalized,
                    "MPI was finalized already and cannot start again in the same "
                    "process; call init_world() once, finalize_world() at exit");
  const char* level = std::getenv("STRATA_MPI_THREAD_LEVEL");
  const bool want_serialized = level && std::string_view(level) == "serialized";
  STRATA_USER_CHECK(!level || want_serialized || std::string_view(level) == "multiple",
                    "STRATA_MPI_THREAD_LEVEL={} is not 'multiple' or 'serialized'", level);
  const int wanted = want_serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
  int already = 0, provided = 0;
  MPI_Initialized(&already);
  if (already) {
    MPI_Query_thread(&provided);
  } else {
    const int rc = MPI_Init_thread(nullptr, nullptr, wanted, &provided);
    if (rc != MPI_SUCCESS) user_error("MPI_Init_thread failed: {}", mpi_error_string(rc));
    rt.we_initialized = true;
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    user_error(
        "this MPI library offers thread level {} (MPI_THREAD_SINGLE = {}, FUNNELED = {}), but "
        "Strata's communication threads need MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE; use "
        "an MPI built with thread support (OpenMPI: --enable-mpi-thread-multiple)",
        provided, MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED);
  }
  rt.serialized = want_serialized || provided < MPI_THREAD_MULTIPLE;
  if (rt.serialized) log::debug("MPI: serialized mode (one lock around every MPI call)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  create_half_ops();  // Note [Half-precision MPI reductions]
  rt.initialized = true;
}

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::unique_ptr<Communicator> make_mpi_world(std::string name, std::chrono::milliseconds timeout) {
  STRATA_USER_CHECK(timeout.count() > 0, "communicator timeout must be positive, got {} ms",
                    timeout.count());
  mpi_init();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    auto ml = mpi_lock();
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS)
      user_error("MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi_error_string(rc));
  }
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout);
}

void mpi_finalize() {
  auto& rt = mpi_runtime();
  std::vector<std::shared_ptr<MpiEngine>> live;
  {
    std::lock_guard lk(rt.mu);
    if (!rt.initialized || rt.finalized) return;
    rt.finalized = true;
    for (auto& w : rt.engines) {
      if (auto e = w.lock()) live.push_back(std::move(e));
    }
    rt.engines.clear();
  }
  bool stuck = false;
  for (auto& e : live) stuck |= !e->close();
  if (stuck) {
    log::error("finalize: an MPI operation is stuck (see above); aborting every rank");
    mpi_abort(1);
  }
  if (rt.we_initialized && mpi_active()) MPI_Finalize();
}

void mpi_abort(int code) {
  std::fflush(nullptr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace strata::comm

#else  // !STRATA_HAVE_MPI

namespace strata::comm {

namespace {
[[noreturn]] void no_mpi() {
  user_error(
      "this Strata build has no MPI: install an MPI (e.g. apt install libopenmpi-dev) and "
      "reconfigure with -DSTRATA_WITH_MPI=ON, or run a single process");
}
}  // namespace

bool mpi_built() {
  return false;
}
void mpi_init() {
  no_mpi();
}
bool mpi_active() {
  return false;
}
std::unique_ptr<Communicator> make_mpi_world(std::string, std::chrono::milliseconds) {
  no_mpi();
}
void mpi_finalize() {}
void mpi_abort(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace strata::comm

#endif
