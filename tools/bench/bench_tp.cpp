// bench_tp: tensor parallelism's communication per transformer layer on CPU ranks: the volume
// and time of the collectives one GPT-2 block's forward + backward issues at tp = the world size,
// against Megatron's count, and the block's time against the same block on one rank (tp = 1,
// every rank alone) measured in the same run.
//
//   mpirun -np N bench_tp [--embd C] [--heads H] [--batch B] [--seq T] [--reps R] [--sp]
//
// Expected volume per layer, forward + backward, for activations of B*T*C f32 (4 bytes each):
// without sequence parallelism 4 all-reduces of 4BTC bytes (attention and MLP outputs forward,
// their inputs' gradients backward); with it 4 all-gathers and 4 reduce-scatters of 4BTC bytes
// (Korthikanti et al. 2022: the same bytes on the wire) plus the 2 all-gathers backward that
// bring the column-parallel layers' inputs back (Note [Sequence-parallel saved input]; Megatron
// does the same and overlaps them with the input-gradient GEMM). "comm share" is the time inside
// the collectives (issue to completion; the mappings wait at once) over the block's time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "comm/communicator.h"
#include "comm/world.h"
#include "core/error.h"
#include "models/gpt2/block.h"
#include "tensor/ops.h"
#include "tools/bench/bench_cli.h"

namespace {

using strata::comm::Communicator;
using strata::comm::ReduceOp;
using strata::comm::WorkHandle;
using strata::tensor::Tensor;
using Clock = std::chrono::steady_clock;

// Forwards to a communicator and counts, per op, the calls, the bytes of the whole buffer and the
// seconds from issue to the end of wait().
class CountingCommunicator final : public Communicator {
 public:
  struct Tally {
    int64_t calls = 0, bytes = 0;
    double seconds = 0;
  };
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  const std::string& name() const override { return inner_->name(); }
  WorkHandle allreduce(Tensor t, ReduceOp op) override {
    return timed("allreduce", static_cast<int64_t>(t.nbytes()), inner_->allreduce(t, op));
  }
  WorkHandle reduce_scatter(Tensor in, Tensor out, ReduceOp op) override {
    return timed("reduce_scatter", static_cast<int64_t>(in.nbytes()),
                 inner_->reduce_scatter(in, out, op));
  }
  WorkHandle allgather(Tensor in, Tensor out) override {
    return timed("allgather", static_cast<int64_t>(out.nbytes()), inner_->allgather(in, out));
  }
  WorkHandle broadcast(Tensor t, int root) override { return inner_->broadcast(t, root); }
  WorkHandle send(Tensor t, int peer, int tag) override { return inner_->send(t, peer, tag); }
  WorkHandle recv(Tensor t, int peer, int tag) override { return inner_->recv(t, peer, tag); }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    return inner_->split(color, key, std::move(name));
  }
  void set_timeout(std::chrono::milliseconds t) override { inner_->set_timeout(t); }

  std::map<std::string, Tally> tallies;
  bool counting = false;

 private:
  class TimedWork final : public strata::comm::Work {
   public:
    TimedWork(WorkHandle w, Tally* tally, Clock::time_point start)
        : w_(std::move(w)), tally_(tally), start_(start) {}
    void wait() override {
      w_->wait();
      if (tally_ != nullptr && !waited_)
        tally_->seconds += std::chrono::duration<double>(Clock::now() - start_).count();
      waited_ = true;
    }
    bool done() const override { return w_->done(); }

   private:
    WorkHandle w_;
    Tally* tally_;
    Clock::time_point start_;
    bool waited_ = false;
  };

  WorkHandle timed(const std::string& op, int64_t bytes, WorkHandle w) {
    Tally* t = nullptr;
    if (counting) {
      t = &tallies[op];
      ++t->calls;
      t->bytes += bytes;
    }
    return std::make_shared<TimedWork>(std::move(w), t, Clock::now());
  }

  std::shared_ptr<Communicator> inner_;
};

struct Args {
  int64_t embd = 768, heads = 12, batch = 4, seq = 256;
  int reps = 10;
  bool sp = false;
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"Tensor parallelism's communication per GPT-2 layer on CPU ranks", "bench_tp"};
  strata::bench::count_option(app, "--embd", a.embd, "width (n_embd)");
  strata::bench::count_option(app, "--heads", a.heads, "attention heads (divisible by the ranks)");
  strata::bench::count_option(app, "--batch", a.batch, "sequences");
  strata::bench::count_option(app, "--seq", a.seq, "tokens per sequence");
  strata::bench::count_option(app, "--reps", a.reps, "timed repetitions (median)");
  app.add_flag("--sp", a.sp, "sequence parallelism (--seq divisible by the ranks)");
  return strata::bench::parse_args(app, argc, argv);
}

// Median seconds of one forward + backward of `block` on `x` (after one warm-up), the slowest
// rank's after a barrier.
double median_step(strata::models::gpt2::Block& block, const Tensor& x, int reps,
                   Communicator& world, CountingCommunicator* counter) {
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    if (counter) counter->counting = r > 0;
    world.barrier();
    const auto t0 = Clock::now();
    strata::autograd::Variable in(x, true);
    strata::autograd::Variable y = block(in);
    strata::autograd::sum_all(y).backward();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    Tensor slowest = strata::tensor::from_vector({static_cast<float>(s)}, {1});
    world.allreduce(slowest, ReduceOp::Max)->wait();
    if (r > 0) times.push_back(strata::tensor::to_float_vector(slowest)[0]);
    block.zero_grad();
  }
  if (counter) counter->counting = false;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const Args& a, int tp, const CountingCommunicator& counter, double t_tp,
            double t_alone) {
  const double act = 4.0 * static_cast<double>(a.batch * a.seq * a.embd);
  // Under sequence parallelism the replicated parameters' gradients are all-reduced too (Note
  // [Replicated parameters under sequence parallelism]): ln_1, ln_2 (weight and bias) and the
  // two row-parallel biases, 6C floats.
  const double replicated = 4.0 * 6 * static_cast<double>(a.embd);
  std::printf(
      "bench_tp: one GPT-2 block (C %lld, %lld heads), B %lld x T %lld, f32, tp %d%s, "
      "%d reps (median)\n",
      static_cast<long long>(a.embd), static_cast<long long>(a.heads),
      static_cast<long long>(a.batch), static_cast<long long>(a.seq), tp,
      a.sp ? " + sequence parallel" : "", a.reps);
  std::printf("%-16s%10s%16s%16s%12s\n", "collective", "per step", "bytes per step",
              "expected bytes", "ms per step");
  const std::map<std::string, double> expected =
      a.sp ? std::map<std::string, double>{{"allgather", 6 * act},
                                           {"reduce_scatter", 4 * act},
                                           {"allreduce", replicated}}
           : std::map<std::string, double>{{"allreduce", 4 * act}};
  double comm_s = 0;
  for (const auto& [op, t] : counter.tallies) {
    const double per = static_cast<double>(a.reps);
    auto it = expected.find(op);
    std::printf("%-16s%10.1f%16.0f%16.0f%12.3f\n", op.c_str(), t.calls / per, t.bytes / per,
                it == expected.end() ? 0.0 : it->second, 1e3 * t.seconds / per);
    comm_s += t.seconds / per;
  }
  std::printf(
      "block forward + backward: tp %d %.3f ms, alone (tp 1, same run) %.3f ms, "
      "ratio %.2f; comm share %.0f%%\n",
      tp, 1e3 * t_tp, 1e3 * t_alone, t_tp / t_alone, 100.0 * comm_s / t_tp);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const std::optional<int> status = parse(argc, argv, a)) return *status;
  try {
    std::shared_ptr<Communicator> world =
        strata::comm::init_world("auto", strata::Device::cpu(), std::chrono::minutes(5));
    const int tp = world->size();
    STRATA_USER_CHECK(a.heads % tp == 0 && (!a.sp || a.seq % tp == 0),
                      "--heads {} (and with --sp --seq {}) must divide by the {} ranks", a.heads,
                      a.seq, tp);
    strata::models::gpt2::GPT2Config c;
    c.n_embd = a.embd;
    c.n_head = a.heads;
    c.n_layer = 1;
    c.n_positions = a.seq;
    auto counter = std::make_shared<CountingCommunicator>(world);
    strata::models::gpt2::Block parallel(c, {counter, a.sp});
    strata::models::gpt2::Block alone(c, {});
    parallel.reset_parameters(1);
    alone.reset_parameters(1);
    const Tensor whole =
        strata::tensor::randn({a.batch, a.seq, a.embd}, strata::RngKey{7, 0}, 0.f, 1.f);
    const Tensor mine =
        a.sp ? strata::autograd::sequence_shard(whole, counter).contiguous() : whole;

    const double t_alone = median_step(alone, whole, a.reps, *world, nullptr);
    const double t_tp = median_step(parallel, mine, a.reps, *world, counter.get());
    if (world->rank() == 0) report(a, tp, *counter, t_tp, t_alone);
    counter.reset();
    world.reset();
    strata::comm::finalize_world();
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bench_tp: %s\n", e.what());
    strata::comm::abort_world(1);
  }
}
