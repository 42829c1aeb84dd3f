// NCCL for the emulated device (Note [CUDA emulator] in simt.h): each process of an mpirun job is
// one rank with its own emulated GPU, and the ranks of a communicator meet in POSIX shared memory.
//
// Note [Emulated NCCL]
// - ncclGetUniqueId names a shared-memory segment; ncclCommInitRank maps it (created zeroed by
//   whichever rank comes first), waits for every rank, and rank 0 then unlinks the name, so
//   nothing is left in /dev/shm once the communicator exists. As in real NCCL, two ranks on the
//   same device are refused (ncclInvalidUsage, "Duplicate GPU detected"): the processes share
//   one machine's STRATA_CUDA_EMU_DEVICES devices, so ranks must take different indices.
// - A collective is enqueued on its stream like a kernel (Note [Emulated streams]) and runs when
//   the host waits for it. It moves the data through one slot of kSlotBytes per rank, a chunk at
//   a time: every rank writes its chunk, a barrier, every rank reads what it needs, a barrier.
//   The barrier is a counter in the segment that only grows: the k-th barrier of a communicator
//   is passed when the counter reaches k * nranks.
// - Reductions add the ranks' values in rank order, in f32 for f32/bf16/f16 (one rounding to
//   bf16/f16 at the end) and in 64 bits for integers, so every rank gets the same bits and the
//   result does not depend on timing. (Real NCCL's order depends on its ring or tree.)
// - A rank that waits longer than STRATA_CUDA_EMU_NCCL_TIMEOUT_S (default 300) for the others, or
//   whose communicator was aborted by a peer, stops waiting: the op leaves its output as it is
//   and ncclCommGetAsyncError reports ncclRemoteError, as a real communicator does after a peer
//   dies. ncclCommAbort marks the segment aborted, which frees the peers' waits. The host thread
//   that runs the op waits with it, so on the emulator this limit, not Strata's watchdog (Note
//   [Failed ranks]), ends a wait for a missing rank.
// - Point-to-point: each ordered pair of ranks has a mailbox of kPairBytes in the segment. A
//   send writes a chunk, posts it and waits until the receiver has taken it before writing the
//   next; a receive waits for each posted chunk. Sends and receives between a pair match in
//   order, as NCCL's do.
#include <fcntl.h>
#include <nccl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_emu/control.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {

namespace {

constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr int kMaxRanks = 64;
constexpr char kIdMagic[] = "strata-emu-nccl";

struct Segment {
  std::atomic<uint64_t> arrived;  // barrier arrivals, all barriers together
  std::atomic<int> aborted;
  int device[kMaxRanks];  // each rank's device + 1, written before the first barrier
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the barrier's atomics are shared between processes");
constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(Segment) <= kHeaderBytes);

struct Mailbox {
  std::atomic<uint64_t> posted;  // chunks the sender has written
  std::atomic<uint64_t> taken;   // chunks the receiver has read
};
constexpr size_t kPairBytes = size_t{64} << 10;
constexpr size_t kPairStride = 64 + kPairBytes;  // the counters, then the data

// Read at each wait, so a test can shorten it for one op.
std::chrono::seconds wait_limit() {
  const char* v = std::getenv("STRATA_CUDA_EMU_NCCL_TIMEOUT_S");
  const long n = v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : 300;
  return std::chrono::seconds(n > 0 ? n : 300);
}

}  // namespace

}  // namespace strata::cuda_emu

// The opaque communicator of nccl.h.
struct ncclComm {
  int rank = 0, nranks = 1;
  std::string name;
  strata::cuda_emu::Segment* seg = nullptr;
  char* slots = nullptr;
  size_t map_bytes = 0;
  uint64_t barriers = 0;  // barriers this rank has passed (device side, in stream order)
  char* pairs = nullptr;  // nranks * nranks mailboxes, [from][to]
  std::vector<uint64_t> sent, received;  // chunks per peer (device side)
  std::mutex mu;  // the fields below: set by ops on the device, read by the host
  ncclResult_t async = ncclSuccess;
  std::string last_error;
};

namespace strata::cuda_emu {

namespace {

thread_local std::string t_last_error;

ncclResult_t fail(ncclComm* c, ncclResult_t r, std::string msg) {
  if (c != nullptr) {
    std::lock_guard<std::mutex> lock(c->mu);
    c->last_error = msg;
  }
  t_last_error = std::move(msg);
  return r;
}

// Waits until counter >= target; false (and the async error set) when the communicator was
// aborted or the wait ran out.
bool wait_for(ncclComm& c, const std::atomic<uint64_t>& counter, uint64_t target) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.async != ncclSuccess) return false;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0; counter.load(std::memory_order_acquire) < target; ++spins) {
    const bool aborted = c.seg->aborted.load(std::memory_order_acquire) != 0;
    if (aborted || std::chrono::steady_clock::now() - start > wait_limit()) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.async = ncclRemoteError;
      c.last_error = aborted ? "emulated NCCL: a peer aborted the communicator"
                             : "emulated NCCL: the other ranks did not arrive in time";
      return false;
    }
    if (spins < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Waits for every rank at the communicator's next barrier (wait_for's result).
bool barrier(ncclComm& c) {
  const uint64_t target = ++c.barriers * static_cast<uint64_t>(c.nranks);
  c.seg->arrived.fetch_add(1, std::memory_order_acq_rel);
  return wait_for(c, c.seg->arrived, target);
}

Mailbox* mailbox(const ncclComm& c, int from, int to) {
  return reinterpret_cast<Mailbox*>(c.pairs +
                                    static_cast<size_t>(from * c.nranks + to) * kPairStride);
}

char* mailbox_data(const ncclComm& c, int from, int to) {
  return reinterpret_cast<char*>(mailbox(c, from, to)) + 64;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

bool is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

double load(ncclDataType_t t, const char* p) {
  switch (t) {
    case ncclFloat16:
      return __half2float(*reinterpret_cast<const __half*>(p));
    case ncclBfloat16:
      return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
    case ncclFloat32:
      return *reinterpret_cast<const float*>(p);
    default:
      return *reinterpret_cast<const double*>(p);
  }
}

void store(ncclDataType_t t, char* p, double v) {
  switch (t) {
    case ncclFloat16:
      *reinterpret_cast<__half*>(p) = __float2half_rn(static_cast<float>(v));
      break;
    case ncclBfloat16:
      *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case ncclFloat32:
      *reinterpret_cast<float*>(p) = static_cast<float>(v);
      break;
    default:
      *reinterpret_cast<double*>(p) = v;
  }
}

int64_t load_int(ncclDataType_t t, const char* p) {
  switch (t) {
    case ncclInt8:
      return *reinterpret_cast<const int8_t*>(p);
    case ncclUint8:
      return *reinterpret_cast<const uint8_t*>(p);
    case ncclInt32:
      return *reinterpret_cast<const int32_t*>(p);
    case ncclUint32:
      return *reinterpret_cast<const uint32_t*>(p);
    default:
      return *reinterpret_cast<const int64_t*>(p);
  }
}

void store_int(ncclDataType_t t, char* p, int64_t v) {
  const size_t n = type_size(t);
  std::memcpy(p, &v, n);  // little-endian: the low bytes
}

// out[i] = ranks' element i of `slot_offset` combined in rank order, for n elements.
void reduce_slots(const ncclComm& c, size_t slot_offset, ncclDataType_t t, ncclRedOp_t op, size_t n,
                  char* out) {
  const size_t es = type_size(t);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = slot_offset + i * es;
    if (is_float(t)) {
      // f32 arithmetic (one rounding per add, as the CPU's sum of two values), f64 for f64.
      double acc = load(t, c.slots + at);
      for (int r = 1; r < c.nranks; ++r) {
        const double x = load(t, c.slots + static_cast<size_t>(r) * kSlotBytes + at);
        if (op == ncclSum)
          acc = t == ncclFloat64
                    ? acc + x
                    : static_cast<double>(static_cast<float>(acc) + static_cast<float>(x));
        else if (op == ncclMax)
          acc = acc > x || std::isnan(acc) ? acc : x;
        else
          acc = acc < x || std::isnan(acc) ? acc : x;
      }
      store(t, out + i * es, acc);
    } else {
      int64_t acc = load_int(t, c.slots + at);
      for (int r = 1; r < c.nranks; ++r) {
        const int64_t x = load_int(t, c.slots + static_cast<size_t>(r) * kSlotBytes + at);
        acc = op == ncclSum ? acc + x : op == ncclMax ? std::max(acc, x) : std::min(acc, x);
      }
      store_int(t, out + i * es, acc);
    }
  }
}

void open_device(const void* p, size_t n) {
  if (n == 0) return;
  DeviceMemory& mem = DeviceMemory::get();
  if (Allocation* a = mem.find(p, n)) mem.open(*a);
}

// A device pointer range the op may touch (checked at the call, as a kernel launch would not:
// NCCL itself faults; an error here is friendlier).
bool on_device(const void* p, size_t n) {
  if (n == 0) return true;
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  return mem.find(p, n) != nullptr;
}

ncclResult_t check_call(ncclComm* c, ncclDataType_t t, cudaStream_t s) {
  if (c == nullptr) return fail(c, ncclInvalidArgument, "emulated NCCL: null communicator");
  if (type_size(t) == 0) return fail(c, ncclInvalidArgument, "emulated NCCL: unknown data type");
  if (!valid_stream(s)) return fail(c, ncclInvalidArgument, "emulated NCCL: invalid stream");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->async != ncclSuccess) return ncclInvalidUsage;
  return ncclSuccess;
}

}  // namespace

}  // namespace strata::cuda_emu

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->mu);
    t_last_error = comm->last_error;
  }
  return t_last_error.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail(nullptr, ncclInvalidArgument, "emulated NCCL: null id");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::random_device rd;
  std::snprintf(id->internal, sizeof(id->internal), "%s /strata-nccl-%d-%08x%08x", kIdMagic,
                static_cast<int>(::getpid()), rd(), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument, "emulated NCCL: bad nranks or rank");
  id.internal[sizeof(id.internal) - 1] = '\0';
  const std::string text(id.internal);
  const std::string magic = std::string(kIdMagic) + " ";
  if (text.rfind(magic, 0) != 0)
    return fail(nullptr, ncclInvalidArgument, "emulated NCCL: not an id of ncclGetUniqueId");
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->nranks = nranks;
  c->name = text.substr(magic.size());
  c->map_bytes = kHeaderBytes + static_cast<size_t>(nranks) * kSlotBytes +
                 static_cast<size_t>(nranks) * static_cast<size_t>(nranks) * kPairStride;
  c->sent.assign(static_cast<size_t>(nranks), 0);
  c->received.assign(static_cast<size_t>(nranks), 0);
  const int fd = ::shm_open(c->name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return fail(nullptr, ncclSystemError, "emulated NCCL: shm_open failed");
  // Every rank sets the same size; a new segment reads as zeros (the barrier's counter 0).
  if (::ftruncate(fd, static_cast<off_t>(c->map_bytes)) != 0) {
    ::close(fd);
    return fail(nullptr, ncclSystemError, "emulated NCCL: ftruncate failed");
  }
  void* p = ::mmap(nullptr, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return fail(nullptr, ncclSystemError, "emulated NCCL: mmap failed");
  c->seg = static_cast<Segment*>(p);
  c->slots = static_cast<char*>(p) + kHeaderBytes;
  c->pairs = c->slots + static_cast<size_t>(nranks) * kSlotBytes;
  int device = 0;
  cudaGetDevice(&device);
  c->seg->device[rank] = device + 1;
  const bool joined = barrier(*c);  // everyone has mapped it and written its device
  if (rank == 0) ::shm_unlink(c->name.c_str());
  if (!joined) {
    ::munmap(p, c->map_bytes);
    return fail(nullptr, ncclSystemError, "emulated NCCL: the other ranks did not join");
  }
  // Real NCCL (2.5 on) refuses two ranks on one GPU. The processes of an emulated job share one
  // machine and its STRATA_CUDA_EMU_DEVICES devices, so the same index is the same GPU.
  for (int i = 0; i < nranks; ++i) {
    if (i != rank && c->seg->device[i] == device + 1) {
      ::munmap(p, c->map_bytes);
      return fail(nullptr, ncclInvalidUsage,
                  "Duplicate GPU detected : rank " + std::to_string(rank) + " and rank " +
                      std::to_string(i) + " both on CUDA device " + std::to_string(device));
    }
  }
  *out = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  drain_all();  // like the real one, after the communicator's outstanding work
  ::munmap(comm->seg, comm->map_bytes);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->seg->aborted.store(1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->async == ncclSuccess) comm->async = ncclRemoteError;
  }
  drain_all();  // pending ops now return at once
  ::munmap(comm->seg, comm->map_bytes);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (comm == nullptr || async == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(comm->mu);
  *async = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  const size_t es = type_size(datatype), bytes = count * es;
  if (!on_device(sendbuff, bytes) || !on_device(recvbuff, bytes))
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclAllReduce buffers not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclAllReduce");
    open_device(sendbuff, bytes);
    open_device(recvbuff, bytes);
    char* mine = comm->slots + static_cast<size_t>(comm->rank) * kSlotBytes;
    const size_t per = kSlotBytes / es;
    for (size_t first = 0; first < count; first += per) {
      const size_t n = std::min(per, count - first);
      std::memcpy(mine, static_cast<const char*>(sendbuff) + first * es, n * es);
      if (!barrier(*comm)) return;
      reduce_slots(*comm, 0, datatype, op, n, static_cast<char*>(recvbuff) + first * es);
      if (!barrier(*comm)) return;
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  const size_t es = type_size(datatype), nr = static_cast<size_t>(comm->nranks);
  if (!on_device(sendbuff, recvcount * es * nr) || !on_device(recvbuff, recvcount * es))
    return fail(comm, ncclInvalidArgument,
                "emulated NCCL: ncclReduceScatter buffers not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclReduceScatter");
    open_device(sendbuff, recvcount * es * nr);
    open_device(recvbuff, recvcount * es);
    char* mine = comm->slots + static_cast<size_t>(comm->rank) * kSlotBytes;
    const size_t per = kSlotBytes / es / nr;  // elements of each destination per chunk
    for (size_t first = 0; first < recvcount; first += per) {
      const size_t n = std::min(per, recvcount - first);
      for (size_t d = 0; d < nr; ++d)  // slot layout: destination d's n elements at d * per
        std::memcpy(mine + d * per * es,
                    static_cast<const char*>(sendbuff) + (d * recvcount + first) * es, n * es);
      if (!barrier(*comm)) return;
      reduce_slots(*comm, static_cast<size_t>(comm->rank) * per * es, datatype, op, n,
                   static_cast<char*>(recvbuff) + first * es);
      if (!barrier(*comm)) return;
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  const size_t es = type_size(datatype), nr = static_cast<size_t>(comm->nranks);
  const size_t bytes = sendcount * es;
  if (!on_device(sendbuff, bytes) || !on_device(recvbuff, bytes * nr))
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclAllGather buffers not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclAllGather");
    open_device(sendbuff, bytes);
    open_device(recvbuff, bytes * nr);
    char* mine = comm->slots + static_cast<size_t>(comm->rank) * kSlotBytes;
    for (size_t first = 0; first < bytes; first += kSlotBytes) {
      const size_t n = std::min(kSlotBytes, bytes - first);
      // In place (sendbuff is this rank's chunk of recvbuff): copied out before anyone writes.
      std::memcpy(mine, static_cast<const char*>(sendbuff) + first, n);
      if (!barrier(*comm)) return;
      for (size_t r = 0; r < nr; ++r)
        std::memcpy(static_cast<char*>(recvbuff) + r * bytes + first, comm->slots + r * kSlotBytes,
                    n);
      if (!barrier(*comm)) return;
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks)
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclBroadcast root out of range");
  const size_t bytes = count * type_size(datatype);
  if ((comm->rank == root && !on_device(sendbuff, bytes)) || !on_device(recvbuff, bytes))
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclBroadcast buffers not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclBroadcast");
    if (comm->rank == root) open_device(sendbuff, bytes);
    open_device(recvbuff, bytes);
    const char* root_slot = comm->slots + static_cast<size_t>(root) * kSlotBytes;
    for (size_t first = 0; first < bytes; first += kSlotBytes) {
      const size_t n = std::min(kSlotBytes, bytes - first);
      if (comm->rank == root)
        std::memcpy(comm->slots + static_cast<size_t>(root) * kSlotBytes,
                    static_cast<const char*>(sendbuff) + first, n);
      if (!barrier(*comm)) return;
      std::memmove(static_cast<char*>(recvbuff) + first, root_slot, n);
      if (!barrier(*comm)) return;
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks)
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclSend peer out of range");
  const size_t bytes = count * type_size(datatype);
  if (!on_device(sendbuff, bytes))
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclSend buffer not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclSend");
    open_device(sendbuff, bytes);
    Mailbox* mb = mailbox(*comm, comm->rank, peer);
    for (size_t first = 0; first < bytes; first += kPairBytes) {
      const uint64_t seq = ++comm->sent[static_cast<size_t>(peer)];
      if (!wait_for(*comm, mb->taken, seq - 1)) return;  // the previous chunk was read
      std::memcpy(mailbox_data(*comm, comm->rank, peer), static_cast<const char*>(sendbuff) + first,
                  std::min(kPairBytes, bytes - first));
      mb->posted.store(seq, std::memory_order_release);
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_call(comm, datatype, stream); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks)
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclRecv peer out of range");
  const size_t bytes = count * type_size(datatype);
  if (!on_device(recvbuff, bytes))
    return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclRecv buffer not on device");
  enqueue(stream, [=] {
    DeviceOp dev("ncclRecv");
    open_device(recvbuff, bytes);
    Mailbox* mb = mailbox(*comm, peer, comm->rank);
    for (size_t first = 0; first < bytes; first += kPairBytes) {
      const uint64_t seq = ++comm->received[static_cast<size_t>(peer)];
      if (!wait_for(*comm, mb->posted, seq)) return;
      std::memcpy(static_cast<char*>(recvbuff) + first, mailbox_data(*comm, peer, comm->rank),
                  std::min(kPairBytes, bytes - first));
      mb->taken.store(seq, std::memory_order_release);
    }
  });
  return ncclSuccess;
}

}  // extern "C"
