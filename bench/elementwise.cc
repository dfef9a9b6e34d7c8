/*
 * Elementwise and reduction kernels on large contiguous float32 tensors, against memcpy.
 *
 * Every op runs on 16M-element (64 MB) tensors; its figure is GB/s of the bytes it must read plus
 * write at the least (add reads two tensors and writes one: 12 bytes per element; sum reads 4).
 * The limit is memcpy of 64 MB between two already-touched buffers, counted the same way
 * (read + write = 128 MB per call), measured in this run: each repetition of an op is paired with a
 * memcpy taken right before it, so a neighbour that slows the machine slows both. Figures are
 * medians of CPU time (user + system: page faults count), with the wall-clock ratio beside them. The goal
 * is 50% of the limit; PASS/MISS is printed for information and the program always exits 0.
 *
 * Out-of-place ops (add, exp, clone, to, ...) include allocating their 64 MB output: glibc serves a
 * block that large with a fresh mmap, so every call pays a page fault per 4 KiB page on first
 * touch (the "faults" column counts minor page faults per call). The in-place ops (add_, mul_, ...)
 * write into a preallocated tensor and show the kernel alone. Ops whose implementation throws
 * NotSupportedError (not written yet) print "not available".
 *
 * --threads N (default 1) sets the intra-op threads (blas::setNumThreads): the compute-bound
 * kernels (transcendentals, pow) split large tensors across them (core/util/parallel.h), the
 * memory-bound ones stay on one. CPU time then sums the threads, so with N > 1 an op's GB/s comes
 * from wall-clock time instead; the limit stays one core's memcpy by CPU time, as the goal defines it.
 *
 * The header also gives the time of one op-dispatch lookup (dispatch.h), what every op pays to
 * reach its kernel; `--n 256` shows ops whose fixed costs dominate.
 *
 * Usage: elementwise [--n 16777216] [--reps 9] [--only SUBSTRING] [--threads 1]
 */
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/ops/detail/simd.h>
#include <cohort/core/ops/dispatch.h>

namespace {

using namespace cohort;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU seconds of this process (user + system, so page faults count): on a machine shared with
// other jobs it leaves out the time the scheduler gave to someone else, which wall time includes.
double cpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

long minorFaults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

struct Case {
  std::string name;
  double bytesPerElement;  // read + written, at the least
  // Runs the op once; an out-of-place op returns its result so that freeing it is not timed.
  std::function<Tensor()> run;
  // Untimed: restores an in-place op's target before each repetition.
  std::function<void()> reset = nullptr;
};

// The mean time of dispatch::kernel for two CPU ops in turn, over 10^7 lookups.
double lookupNanoseconds() {
  constexpr int kLookups = 10000000;
  const auto t0 = Clock::now();
  for (int i = 0; i < kLookups; ++i) {
    auto* k = dispatch::kernel<dispatch::BinaryKernel>((i & 1) != 0 ? "add" : "relu backward", Device::cpu());
    asm volatile("" : : "r"(k) : "memory");  // keeps the lookup
  }
  return seconds(t0) / kLookups * 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 24;
  int reps = 9;
  std::string only;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: elementwise [--n 16777216] [--reps 9] [--only SUBSTRING] [--threads 1]\n");
      return 2;
    }
  }
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  if (side * side != n) {
    std::fprintf(stderr, "--n must be a perfect square (the row/column reductions use a side x side view)\n");
    return 2;
  }
  autograd::NoGradGuard noGrad;
  blas::setNumThreads(threads);

  // Inputs: positive values, so log/sqrt/rsqrt/pow stay finite; nothing decays to denormals.
  Tensor a = rand({n}) + 0.5;
  Tensor b = rand({n}) + 0.5;
  Tensor c = rand({n}) + 0.5;
  Tensor x = a.clone();  // in-place target, restored from `a` before every repetition
  Tensor cond = empty({n}, {.dtype = DType::Bool});
  {
    bool* p = cond.data<bool>();
    for (int64_t i = 0; i < n; ++i) p[i] = ((i * 2654435761u) >> 7) & 1;
  }
  Tensor a2 = a.view({side, side});
  Tensor aBf16, aF16, bBf16, bF16;
  try {
    aBf16 = a.to(DType::BFloat16);
    aF16 = a.to(DType::Float16);
    bBf16 = b.to(DType::BFloat16);
    bF16 = b.to(DType::Float16);
  } catch (const Error&) {
  }
  // A half operand, or NotSupportedError when this build has no half conversions.
  auto half = [](const Tensor& t) -> const Tensor& {
    if (!t.defined()) throw NotSupportedError("half-precision conversion is not available");
    return t;
  };
  // Rows of the reference GPT's width for layer norm (the last n % 384 elements are left out).
  const Tensor aRows = a.narrow(0, 0, n / 384 * 384).view({n / 384, 384});
  const Tensor aBf16Rows = aBf16.defined() ? aBf16.narrow(0, 0, n / 384 * 384).view({n / 384, 384}) : Tensor();
  const Tensor lnWeight = rand({384}) + 0.5, lnBias = rand({384});
  const Tensor lnWeightBf16 = lnWeight.to(DType::BFloat16), lnBiasBf16 = lnBias.to(DType::BFloat16);
  std::vector<char> src(static_cast<size_t>(n) * 4), dst(static_cast<size_t>(n) * 4);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  auto memcpyOnce = [&] {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    return seconds(t0);
  };
  auto restoreX = [&] { std::memcpy(x.dataPtr(), a.dataPtr(), static_cast<size_t>(n) * 4); };

  std::vector<Case> cases = {
      {"memcpy (the limit)", 8,
       [&] {
         std::memcpy(dst.data(), src.data(), src.size());
         return Tensor();
       }},
      {"copy_ (into preallocated)", 8,
       [&] {
         x.copy_(a);
         return Tensor();
       }},
      {"clone", 8, [&] { return a.clone(); }},
      {"add(a, b)", 12, [&] { return add(a, b); }},
      {"sub(a, b)", 12, [&] { return sub(a, b); }},
      {"mul(a, b)", 12, [&] { return mul(a, b); }},
      {"div(a, b)", 12, [&] { return div(a, b); }},
      {"add(a, 1.5)", 8, [&] { return add(a, Scalar(1.5)); }},
      {"mul(a, 0.5)", 8, [&] { return mul(a, Scalar(0.5)); }},
      {"neg", 8, [&] { return neg(a); }},
      {"abs", 8, [&] { return abs(a); }},
      {"exp", 8, [&] { return exp(a); }},
      {"log", 8, [&] { return log(a); }},
      {"sqrt", 8, [&] { return sqrt(a); }},
      {"rsqrt", 8, [&] { return rsqrt(a); }},
      {"tanh", 8, [&] { return tanh(a); }},
      {"sigmoid", 8, [&] { return sigmoid(a); }},
      {"relu", 8, [&] { return relu(a); }},
      {"gelu (erf)", 8, [&] { return gelu(a); }},
      {"gelu (tanh)", 8, [&] { return gelu(a, true); }},
      {"silu", 8, [&] { return silu(a); }},
      {"pow(a, 2)", 8, [&] { return pow(a, Scalar(2.0)); }},
      {"pow(a, 1.7)", 8, [&] { return pow(a, Scalar(1.7)); }},
      {"pow(a, b)", 12, [&] { return pow(a, b); }},
      {"clamp(a, 0.7, 1.2)", 8, [&] { return clamp(a, Scalar(0.7), Scalar(1.2)); }},
      {"maximum(a, b)", 12, [&] { return maximum(a, b); }},
      {"where(cond, a, b)", 13, [&] { return where(cond, a, b); }},
      {"gt(a, b) -> bool", 9, [&] { return gt(a, b); }},
      {"eq(a, b) -> bool", 9, [&] { return eq(a, b); }},
      {"add_(b)", 12,
       [&] {
         x.add_(b);
         return Tensor();
       },
       restoreX},
      {"add_(b, alpha=0.1)", 12,
       [&] {
         x.add_(b, Scalar(0.1));
         return Tensor();
       },
       restoreX},
      {"mul_(b)", 12,
       [&] {
         x.mul_(b);
         return Tensor();
       },
       restoreX},
      {"mul_(0.9)", 8,
       [&] {
         x.mul_(Scalar(0.9));
         return Tensor();
       },
       restoreX},
      {"addcmul_(b, c, 0.1)", 16,
       [&] {
         x.addcmul_(b, c, Scalar(0.1));
         return Tensor();
       },
       restoreX},
      {"addcdiv_(b, c, 0.1)", 16,
       [&] {
         x.addcdiv_(b, c, Scalar(0.1));
         return Tensor();
       },
       restoreX},
      {"lerp_(b, 0.1)", 12,
       [&] {
         x.lerp_(b, Scalar(0.1));
         return Tensor();
       },
       restoreX},
      {"zero_", 4,
       [&] {
         x.zero_();
         return Tensor();
       },
       restoreX},
      {"fill_(0.5)", 4,
       [&] {
         x.fill_(Scalar(0.5));
         return Tensor();
       },
       restoreX},
      {"to(bfloat16)", 6, [&] { return a.to(DType::BFloat16); }},
      {"to(float16)", 6, [&] { return a.to(DType::Float16); }},
      {"bfloat16 to(float32)", 6,
       [&] {
         if (!aBf16.defined()) throw NotSupportedError("to(bfloat16) is not available");
         return aBf16.to(DType::Float32);
       }},
      {"float16 to(float32)", 6,
       [&] {
         if (!aF16.defined()) throw NotSupportedError("to(float16) is not available");
         return aF16.to(DType::Float32);
       }},
      {"bfloat16 add(a, b)", 6, [&] { return add(half(aBf16), bBf16); }},
      {"bfloat16 mul(a, 0.5)", 4, [&] { return mul(half(aBf16), Scalar(0.5)); }},
      {"bfloat16 relu", 4, [&] { return relu(half(aBf16)); }},
      {"float16 add(a, b)", 6, [&] { return add(half(aF16), bF16); }},
      {"layerNorm over 384 (weight, bias)", 8,
       [&] { return nn::functional::layerNorm(aRows, {384}, lnWeight, lnBias, 1e-5); }},
      {"bfloat16 layerNorm over 384 (weight, bias)", 4,
       [&] {
         if (!aBf16.defined()) throw NotSupportedError("to(bfloat16) is not available");
         return nn::functional::layerNorm(aBf16Rows, {384}, lnWeightBf16, lnBiasBf16, 1e-5);
       }},
      {"sum (all)", 4, [&] { return sum(a); }},
      {"sum over last dim [4096,4096]", 4, [&] { return sum(a2, {1}); }},
      {"sum over first dim [4096,4096]", 4, [&] { return sum(a2, {0}); }},
      {"mean (all)", 4, [&] { return mean(a); }},
      {"amax (all)", 4, [&] { return amax(a); }},
      {"max over last dim (values, indices)", 4, [&] { return max(a2, 1).first; }},
      {"var (all)", 4, [&] { return var(a); }},
      {"norm (all, p=2)", 4, [&] { return norm(a); }},
      {"softmax over last dim [4096,4096]", 8, [&] { return nn::functional::softmax(a2, 1); }},
  };
  if (side != 4096)
    for (auto& cs : cases) {
      auto p = cs.name.find("[4096,4096]");
      if (p != std::string::npos) cs.name.replace(p, 11, "[" + std::to_string(side) + "," + std::to_string(side) + "]");
    }

  std::printf("%lld float32 elements (%.0f MB per tensor), %d intra-op thread%s, median of %d repetitions each "
              "paired with a one-thread memcpy\n",
              static_cast<long long>(n), n * 4 / 1e6, threads, threads == 1 ? "" : "s", reps);
  std::printf("GB/s = 1e9 bytes (read + written) per second; the limit is memcpy counted the same way; bar 50%%\n");
  std::printf("compute-bound float32 kernels run %s code (COHORT_SIMD=avx2 turns AVX-512 off)\n\n",
              detail::simd::describe());
  if (threads == 1)
    std::printf("GB/s and the ratio use CPU time of this process (user + system); the last column is the same ratio\n"
                "from wall-clock time, which on a shared machine also counts time spent descheduled\n\n");
  else
    std::printf("GB/s uses wall-clock time (CPU time would sum the threads), the limit memcpy's CPU time (one\n"
                "thread; the stricter of the two); the last column compares wall-clock times on both sides\n\n");
  std::printf("op dispatch: %.1f ns per kernel lookup (the cost every op pays to reach its kernel)\n\n",
              lookupNanoseconds());
  std::printf("%-38s %9s %9s %7s %7s %9s %10s\n", "op", "GB/s", "limit", "ratio", "bar", "faults", "wall ratio");
  int pass = 0, miss = 0, unavailable = 0;
  std::vector<double> limits;
  for (auto& cs : cases) {
    if (!only.empty() && cs.name.find(only) == std::string::npos) continue;
    try {
      if (cs.reset) cs.reset();
      Tensor warm = cs.run();  // first call: also tells whether the op exists yet
    } catch (const NotSupportedError& e) {
      std::printf("%-38s not available (%s)\n", cs.name.c_str(), e.what());
      ++unavailable;
      continue;
    } catch (const std::exception& e) {
      std::printf("%-38s error: %s\n", cs.name.c_str(), e.what());
      ++unavailable;
      continue;
    }
    std::vector<double> tOp, tLimit, cOp, cLimit;
    long faults = 0;
    for (int r = 0; r < reps; ++r) {
      if (cs.reset) cs.reset();
      // The memcpy (128 MB touched, more than the 32 MB L3) also evicts the restored target, so
      // the op starts from memory like the limit does.
      double c0 = cpuNow();
      tLimit.push_back(memcpyOnce());
      cLimit.push_back(cpuNow() - c0);
      long f0 = minorFaults();
      c0 = cpuNow();
      auto t0 = Clock::now();
      Tensor out = cs.run();
      tOp.push_back(seconds(t0));
      cOp.push_back(cpuNow() - c0);
      faults += minorFaults() - f0;
    }
    double bytes = cs.bytesPerElement * static_cast<double>(n);
    double gbs = bytes / median(threads == 1 ? cOp : tOp) / 1e9;
    // The limit always from memcpy's CPU time: it is one thread, and descheduling (which
    // wall-clock time would count) only makes memcpy look slower and the ratio better.
    double limit = 8.0 * static_cast<double>(n) / median(cLimit) / 1e9;
    double wallRatio = (bytes / median(tOp)) / (8.0 * static_cast<double>(n) / median(tLimit));
    limits.push_back(limit);
    double ratio = gbs / limit;
    bool ok = ratio >= 0.5;
    (ok ? pass : miss)++;
    std::printf("%-38s %9.2f %9.2f %6.0f%% %7s %9ld %9.0f%%\n", cs.name.c_str(), gbs, limit, 100 * ratio,
                ok ? "PASS" : "MISS", faults / reps, 100 * wallRatio);
    std::fflush(stdout);
  }
  // The cost of a fresh 64 MB output by itself: allocate, write once, free (what out-of-place ops pay).
  if (only.empty()) {
    std::vector<double> tFresh, tWarm;
    long faults = 0;
    for (int r = 0; r < reps; ++r) {
      long f0 = minorFaults();
      double c0 = cpuNow();
      {
        Tensor t = empty({n});
        std::memset(t.dataPtr(), 0, static_cast<size_t>(n) * 4);
        tFresh.push_back(cpuNow() - c0);
      }
      faults += minorFaults() - f0;
      c0 = cpuNow();
      std::memset(x.dataPtr(), 0, static_cast<size_t>(n) * 4);
      tWarm.push_back(cpuNow() - c0);
    }
    std::printf("\nwhere out-of-place time goes: writing 64 MB into a fresh empty() tensor takes %.1f ms of CPU (%ld "
                "page faults), into an already-touched one %.1f ms\n",
                median(tFresh) * 1e3, faults / reps, median(tWarm) * 1e3);
  }
  if (!limits.empty())
    std::printf("memcpy limit over the run: median %.2f GB/s, min %.2f, max %.2f (spread = machine noise)\n",
                median(limits), *std::min_element(limits.begin(), limits.end()),
                *std::max_element(limits.begin(), limits.end()));
  std::printf("%d at or above 50%% of the limit, %d below, %d not available\n", pass, miss, unavailable);
  return 0;
}
