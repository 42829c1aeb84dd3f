// bench_comm: bus bandwidth of the mpi communicator's allreduce, reduce_scatter and allgather
// against the same MPI calls made directly on the same buffers, in the same run.
//
//   mpirun -np N bench_comm [--max-mib M] [--reps R]     (defaults: 256 MiB, 20 repetitions)
//
// Sizes go from 4 KiB to M MiB in steps of 4x; each is the whole buffer (allreduce's tensor,
// reduce_scatter's input, allgather's output), f32. Every repetition starts after a barrier and
// counts the slowest rank's time; the table shows the median (of the medians of three
// interleaved rounds below 16 MiB). Bus bandwidth follows nccl-tests
// (PERFORMANCE.md): algbw = bytes / time; busbw = algbw * 2(n-1)/n for allreduce and
// algbw * (n-1)/n for reduce_scatter and allgather, so it is comparable across rank counts.
// "ratio" is Strata's busbw over raw MPI's: below 1 is the cost of the communication thread
// (a queue hand-off and a condition-variable wake-up per op).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/error.h"
#include "tensor/tensor.h"
#include "tools/bench/bench_cli.h"

#if STRATA_HAVE_MPI
#include <mpi.h>

namespace {

using strata::comm::Communicator;
using strata::tensor::Tensor;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t max_mib = 256;
  int reps = 20;
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"Collectives' bus bandwidth against the raw MPI calls", "bench_comm"};
  strata::bench::count_option(app, "--max-mib", a.max_mib, "largest message, MiB");
  strata::bench::count_option(app, "--reps", a.reps, "timed repetitions (median)");
  return strata::bench::parse_args(app, argc, argv);
}

// Seconds of `op` on the slowest rank, after a barrier, median over `reps` (plus one warm-up).
double median_seconds(int reps, const std::function<void()>& op) {
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    op();
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 0) times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string size_str(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const std::optional<int> status = parse(argc, argv, args)) return *status;
  try {
    auto world = strata::comm::init_world("mpi", strata::Device::cpu(), std::chrono::minutes(5));
    const int n = world->size(), rank = world->rank();
    int multiple = 0;
    MPI_Query_thread(&multiple);
    if (rank == 0) {
      std::printf(
          "bench_comm: %d ranks, f32, median of %d reps (slowest rank), MPI thread level "
          "%s\n\n",
          n, args.reps, multiple == MPI_THREAD_MULTIPLE ? "multiple" : "serialized");
      std::printf(
          "| op | size | Strata us | Strata busbw GB/s | MPI us | MPI busbw GB/s | ratio |\n");
      std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
    }
    const char* ops[] = {"allreduce", "reduce_scatter", "allgather"};
    for (const char* op : ops) {
      for (int64_t bytes = 4 << 10; bytes <= (args.max_mib << 20); bytes *= 4) {
        const int64_t count = bytes / 4 / n * n;  // divisible into n chunks
        const int64_t chunk = count / n;
        // Large buffers get fewer repetitions and one round, so the table takes minutes, not tens.
        const int reps = static_cast<int>(
            std::clamp<int64_t>((int64_t{16} << 20) / bytes * args.reps, 3, args.reps));
        const int rounds = bytes >= (int64_t{16} << 20) ? 1 : 3;
        Tensor whole = strata::tensor::ones({count});
        Tensor part = strata::tensor::ones({chunk});
        Tensor raw_whole = strata::tensor::ones({count});
        Tensor raw_part = strata::tensor::ones({chunk});
        std::function<void()> strata_op, mpi_op;
        double factor = 1;
        const std::string name = op;
        if (name == "allreduce") {
          factor = 2.0 * (n - 1) / n;
          strata_op = [&] { world->allreduce(whole)->wait(); };
          mpi_op = [&] {
            MPI_Allreduce(MPI_IN_PLACE, raw_whole.data_ptr(), static_cast<int>(count), MPI_FLOAT,
                          MPI_SUM, MPI_COMM_WORLD);
          };
        } else if (name == "reduce_scatter") {
          factor = 1.0 * (n - 1) / n;
          strata_op = [&] { world->reduce_scatter(whole, part)->wait(); };
          mpi_op = [&] {
            MPI_Reduce_scatter_block(raw_whole.data_ptr(), raw_part.data_ptr(),
                                     static_cast<int>(chunk), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          };
        } else {
          factor = 1.0 * (n - 1) / n;
          strata_op = [&] { world->allgather(part, whole)->wait(); };
          mpi_op = [&] {
            MPI_Allgather(raw_part.data_ptr(), static_cast<int>(chunk), MPI_FLOAT,
                          raw_whole.data_ptr(), static_cast<int>(chunk), MPI_FLOAT, MPI_COMM_WORLD);
          };
        }
        // Interleaved, so drift in the machine's load hits both sides alike.
        std::vector<double> ts, tm;
        for (int round = 0; round < rounds; ++round) {
          ts.push_back(median_seconds(reps, strata_op));
          tm.push_back(median_seconds(reps, mpi_op));
        }
        std::sort(ts.begin(), ts.end());
        std::sort(tm.begin(), tm.end());
        const double s = ts[ts.size() / 2], m = tm[tm.size() / 2];
        const double real_bytes = static_cast<double>(count) * 4;
        const double bus_s = real_bytes / s * factor / 1e9, bus_m = real_bytes / m * factor / 1e9;
        if (rank == 0) {
          std::printf("| %s | %s | %.1f | %.2f | %.1f | %.2f | %.2f |\n", op,
                      size_str(bytes).c_str(), s * 1e6, bus_s, m * 1e6, bus_m, bus_s / bus_m);
          std::fflush(stdout);
        }
      }
    }
    world.reset();
    strata::comm::finalize_world();
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    strata::comm::abort_world(1);
  }
}

#else

int main() {
  std::fprintf(stderr, "bench_comm: this build has no MPI\n");
  return 1;
}

#endif
