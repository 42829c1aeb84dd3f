// bench_safetensors: what the digests of Note [Safetensors digests] cost a checkpoint's files,
// against the same bytes moved without them, measured in the same run, rounds interleaved.
//
//   bench_safetensors [--mib M] [--tensors N] [--rounds R] [--dir D]
//   (defaults: 1024 MiB in 16 f32 tensors, 5 rounds, $TMPDIR or /tmp)
//
// Write: save_safetensors (host copies, per-tensor digests, header digest, then the file through
// AtomicFile: write, fsync, rename) against AtomicFile writing the same header and data bytes.
// Read: SafetensorsReader opening the file and reading every tensor (each checked against its
// digest) against reading the same byte ranges into the same tensors with no check; and
// verify(), the streaming check load_checkpoint runs before it loads. The files were just
// written, so the reads are mostly from the page cache: the ratios show the digests' CPU cost,
// which a disk-bound read hides further. The write includes fsync, so it varies with the disk.
// Prints a markdown table of medians, and the checksum's own rate over the data in memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "offload/checksum.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"
#include "tools/bench/bench_cli.h"

namespace {

namespace fs = std::filesystem;
using strata::tensor::Tensor;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The 8-byte length and the header of a safetensors file.
std::string header_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string head(8 + n, '\0');
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return head;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024, count = 16;
  int rounds = 5;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp && *tmp ? tmp : "/tmp";
  // Note [Bench command line].
  CLI::App app{
      "What the safetensors digests cost a checkpoint's files, against the same bytes "
      "without them",
      "bench_safetensors"};
  strata::bench::count_option(app, "--mib", mib, "MiB of f32 tensors written and read");
  strata::bench::count_option(app, "--tensors", count, "tensors they are cut into");
  strata::bench::count_option(app, "--rounds", rounds, "interleaved rounds (medians)");
  strata::bench::value_option(app, "--dir", dir, "directory of the files ($TMPDIR or /tmp)");
  if (const std::optional<int> status = strata::bench::parse_args(app, argc, argv)) return *status;
  try {
    const int64_t per = mib * (int64_t{1} << 20) / 4 / count;
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (int64_t i = 0; i < count; ++i)
      tensors.emplace_back(fmt::format("t{:03d}", i),
                           strata::tensor::uniform({per}, {7, static_cast<uint64_t>(i)}, -1, 1));
    const std::string with = (fs::path(dir) / "bench_safetensors_digests.safetensors").string();
    const std::string plain = (fs::path(dir) / "bench_safetensors_plain.bin").string();

    std::vector<double> w_digest, w_plain, r_digest, r_plain, verify, hash;
    std::string head;
    for (int r = 0; r < rounds; ++r) {
      // The same header bytes and data as save_safetensors writes, written as they are: the
      // header is taken from the first round's file.
      auto write_with = [&] {
        const auto t0 = Clock::now();
        strata::tensor::save_safetensors(with, tensors, {{"format", "strata"}});
        w_digest.push_back(seconds_since(t0));
      };
      auto write_plain = [&] {
        const auto t0 = Clock::now();
        strata::AtomicFile f(plain);
        f.write(head.data(), head.size());
        for (const auto& [name, t] : tensors) f.write(t.data_ptr(), t.nbytes());
        f.commit();
        w_plain.push_back(seconds_since(t0));
      };
      // Alternate which goes first: the second write of a round meets the first's flushing.
      if (r % 2 == 0 || head.empty()) {
        write_with();
        if (head.empty()) head = header_of(with);
        write_plain();
      } else {
        write_plain();
        write_with();
      }

      auto t0 = Clock::now();
      {
        strata::tensor::SafetensorsReader reader(with);
        for (const auto& e : reader.entries()) reader.read(e.name);
      }
      r_digest.push_back(seconds_since(t0));

      t0 = Clock::now();
      {
        std::ifstream in(plain, std::ios::binary);
        uint64_t at = head.size();
        for (const auto& [name, t] : tensors) {
          Tensor dst = Tensor::empty(t.shape(), t.dtype());
          in.seekg(static_cast<std::streamoff>(at));
          in.read(static_cast<char*>(dst.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
          at += t.nbytes();
        }
        if (!in) strata::user_error("{}: short read", plain);
      }
      r_plain.push_back(seconds_since(t0));

      t0 = Clock::now();
      strata::tensor::SafetensorsReader(with).verify();
      verify.push_back(seconds_since(t0));

      // The checksums alone, over the tensors in memory, in the digests' 1 MiB blocks.
      t0 = Clock::now();
      uint64_t sink = 0;
      for (const auto& [name, t] : tensors) {
        const char* p = static_cast<const char*>(t.data_ptr());
        for (size_t at = 0; at < t.nbytes(); at += size_t{1} << 20)
          sink ^= strata::offload::checksum64(p + at, std::min(size_t{1} << 20, t.nbytes() - at));
      }
      hash.push_back(seconds_since(t0));
      if (sink == 42) std::printf(" ");
    }
    fs::remove(with);
    fs::remove(plain);

    const double gb = static_cast<double>(mib) * (1 << 20) / 1e9;
    std::printf(
        "## safetensors digests: %lld MiB in %lld tensors, %d rounds (median), %s\n\n"
        "| op | with digests s | GB/s | without s | GB/s | ratio (with / without) |\n"
        "|---|---|---|---|---|---|\n",
        static_cast<long long>(mib), static_cast<long long>(count), rounds, dir.c_str());
    auto row = [&](const char* op, const std::vector<double>& a, const std::vector<double>& b) {
      const double ma = median(a), mb = median(b);
      std::printf("| %s | %.3f | %.2f | %.3f | %.2f | %.2f |\n", op, ma, gb / ma, mb, gb / mb,
                  ma / mb);
    };
    row("write (save_safetensors vs the same bytes)", w_digest, w_plain);
    row("read every tensor (checked vs unchecked)", r_digest, r_plain);
    row("verify() alone (streamed) vs unchecked read", verify, r_plain);
    std::printf("\nchecksum64 alone over the data in memory: %.3f s, %.2f GB/s\n", median(hash),
                gb / median(hash));
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bench_safetensors: %s\n", e.what());
    return 1;
  }
  return 0;
}
