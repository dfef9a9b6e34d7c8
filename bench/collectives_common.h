/*
 * What the collective benchmarks share, so cohort's figures and the bare-library baselines
 * (collectives_mpi_baseline.cc, collectives_gloo_baseline.cc) are measured and printed the same
 * way, nccl-tests style:
 *
 *   op  size(B)  count  type  time(us)  algbw(GB/s)  busbw(GB/s)  #wrong
 *
 * size is the larger buffer of the op (nccl-tests' convention): the tensor for allreduce and
 * broadcast, the gathered output for allgather, the full input for reduce_scatter, the whole send
 * buffer for alltoall. algbw = size / time; busbw = algbw × the op's factor (allreduce 2(n-1)/n,
 * allgather, reduce_scatter and alltoall (n-1)/n, broadcast 1), which makes the figures
 * comparable with the hardware's bandwidth whatever the rank count. time is rank 0's wall time per
 * op, averaged over `iters` back-to-back ops (each waited for) after `warmup` untimed ones, all
 * ranks having left a barrier first. #wrong counts elements that differ from the expected result
 * in one separate, checked call per size (the timed calls run on zeros, so sums never overflow).
 *
 * Lines starting with '#' are comments; scripts/bench_collectives.sh joins the programs' rows.
 */
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace cohort_bench {

using Clock = std::chrono::steady_clock;

inline const std::vector<std::string>& allOps() {
  static const std::vector<std::string> kOps = {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};
  return kOps;
}

inline double busFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;  // allgather, reduce_scatter, alltoall
}

// Sizes from minBytes to maxBytes, multiplying by `factor`, each rounded down to whole float32
// elements — for ops that split their buffer across the n ranks, to a multiple of 4 × n bytes —
// but at least one unit.
inline std::vector<size_t> sizeList(const std::string& op, size_t minBytes, size_t maxBytes, size_t factor, int n) {
  std::vector<size_t> out;
  const bool splits = op != "allreduce" && op != "broadcast";
  const size_t unit = splits ? 4 * static_cast<size_t>(n) : 4;
  for (size_t s = minBytes; s <= maxBytes; s *= factor) {
    size_t r = std::max(unit, s / unit * unit);
    if (out.empty() || out.back() != r) out.push_back(r);
    if (factor < 2) break;
  }
  return out;
}

// Enough iterations to move ~`budgetBytes` per size, within [minIters, maxIters]. The same on
// every rank (a function of the size alone).
inline int itersFor(size_t bytes, size_t budgetBytes, int minIters, int maxIters) {
  size_t it = budgetBytes / std::max<size_t>(bytes, 1);
  return static_cast<int>(std::clamp<size_t>(it, minIters, maxIters));
}

inline void printHeader(const char* program, const std::string& what, int n) {
  std::printf("# %s: %s, %d ranks\n", program, what.c_str(), n);
  std::printf("# %-14s %12s %10s %6s %11s %11s %11s %7s\n", "op", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "#wrong");
  std::fflush(stdout);
}

inline void printRow(const std::string& op, size_t bytes, const char* type, double seconds, int n, long wrong) {
  double algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  std::printf("  %-14s %12zu %10zu %6s %11.2f %11.3f %11.3f %7ld\n", op.c_str(), bytes, bytes / 4, type, seconds * 1e6,
              algbw, algbw * busFactor(op, n), wrong);
  std::fflush(stdout);
}

// One core's memcpy of `bytes` between two touched buffers, in GB/s of bytes copied (the project's
// baseline measurements found 5.4 GB/s at 64 MiB; docs/benchmarks.md). Best of a few runs.
inline double memcpyGBps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  int reps = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / std::max<size_t>(bytes, 1), 3, 100000));
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return static_cast<double>(bytes) / best / 1e9;
}

inline void printMemcpyRows(const std::vector<size_t>& sizes) {
  std::printf("# memcpy limit (one core, this process, before the collectives)\n");
  for (size_t s : sizes) {
    double gbps = memcpyGBps(s);
    std::printf("  %-14s %12zu %10zu %6s %11.2f %11.3f %11.3f %7d\n", "memcpy", s, s / 4, "float",
                static_cast<double>(s) / gbps / 1e3, gbps, gbps, 0);
  }
  std::fflush(stdout);
}

// The bare baselines' buffers are 64-byte aligned, as cohort's tensors are (its allocator's
// alignment): a std::vector<float> from malloc starts 16 bytes into a cache line, and the vector
// loads of MPI's and gloo's reductions and copies then split lines that cohort's do not.
template <typename T>
struct Aligned64Allocator {
  using value_type = T;
  Aligned64Allocator() = default;
  template <typename U>
  Aligned64Allocator(const Aligned64Allocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const Aligned64Allocator<U>&) const {
    return true;
  }
};
using FloatBuffer = std::vector<float, Aligned64Allocator<float>>;

// Element i of rank r's input in the checked call: small integers, so float32 sums are exact.
inline float checkValue(int rank, size_t i) { return static_cast<float>((rank + 1) + static_cast<int>(i % 7)); }

// Wrong elements in `out`, rank `rank`'s output of one checked `op` among n ranks whose inputs
// were input element i = checkValue(r, i): allreduce/broadcast (in place, `count` elements),
// allgather (the gathered `count`), reduce_scatter (this rank's count = total / n) and alltoall.
inline long countWrong(const std::string& op, int rank, int n, const float* out, size_t count) {
  long wrong = 0;
  const size_t chunk = count / static_cast<size_t>(n);
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    if (op == "allreduce") {
      for (int q = 0; q < n; ++q) want += checkValue(q, i);
    } else if (op == "broadcast") {
      want = checkValue(0, i);
    } else if (op == "allgather") {
      want = checkValue(static_cast<int>(i / chunk), i % chunk);
    } else if (op == "reduce_scatter") {
      for (int q = 0; q < n; ++q) want += checkValue(q, static_cast<size_t>(rank) * count + i);
    } else if (op == "alltoall") {
      want = checkValue(static_cast<int>(i / chunk), static_cast<size_t>(rank) * chunk + i % chunk);
    }
    wrong += out[i] != want;
  }
  return wrong;
}

// The bare baselines' checked call: fills `in` with this rank's check values, runs `call` once,
// counts wrong elements of the result (`out`, or `in` for the in-place ops) and zeroes both again
// for the timed calls.
template <typename Call>
long checkedCall(const std::string& op, int rank, int n, FloatBuffer& in, FloatBuffer& out, const Call& call) {
  for (size_t i = 0; i < in.size(); ++i) in[i] = checkValue(rank, i);
  call();
  const FloatBuffer& result = out.empty() ? in : out;
  long wrong = countWrong(op, rank, n, result.data(), result.size());
  std::fill(in.begin(), in.end(), 0.0f);
  std::fill(out.begin(), out.end(), 0.0f);
  return wrong;
}

// The size sweep every collectives program takes: which ops, which sizes (min, max and the factor
// between rows), and how many timed calls per size (budget bytes / size, clamped to the iteration
// bounds) after `warmup` untimed ones.
struct SweepOptions {
  std::string ops = "allreduce,allgather,reduce_scatter,broadcast,alltoall";
  size_t minBytes = 4, maxBytes = size_t{64} << 20, factor = 4, budget = size_t{1} << 30;
  int minIters = 5, maxIters = 1000, warmup = 5;

  void addTo(CLI::App& app) {
    app.add_option("--ops", ops, "comma-separated ops")->capture_default_str();
    app.add_option("--min-bytes", minBytes)->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--max-bytes", maxBytes)->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--factor", factor, "size multiplier between rows")
        ->capture_default_str()
        ->check(CLI::Range(2, 1024));
    app.add_option("--budget-bytes", budget, "bytes to move per size (sets iterations)")->capture_default_str();
    app.add_option("--min-iters", minIters)->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--max-iters", maxIters)->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup)->capture_default_str()->check(CLI::NonNegativeNumber);
  }
  int itersAt(size_t bytes) const { return itersFor(bytes, budget, minIters, maxIters); }
};

inline std::vector<std::string> splitCsv(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace cohort_bench
