/*
 * Fused scaled-dot-product attention (nn::functional::scaledDotProductAttention) against the
 * unfused formula GPT's CausalSelfAttention computed before it used the fused op:
 *   att = matmul(q, k^T) * (1/sqrt(E)) + causal mask;  att = softmax(att);  y = matmul(att, v)
 * (the [T, T] additive mask is built once, outside the timing, as the module's buffer was).
 *
 * Time: forward + backward (gradients of q, k and v for a random output gradient) of causal
 * attention at --tokens (default 1024) tokens, H = 6 heads of E = 64, batch 1, 2, 4, 8, float32,
 * one thread (blas::setNumThreads(1), which also sizes the intra-op pool). Each repetition runs
 * the two paths back to back, so a neighbour that slows the machine slows both; figures are
 * medians of CPU time (user + system of this process: page faults count, time given to other
 * processes does not), with wall-clock medians beside them. The goal: fused at least 2x faster.
 *
 * Memory: peak bytes above what was live before the forward (q, k, v, the output gradient and
 * the mask were), from the CPU allocator's accounting (memoryStats), over forward + backward at
 * 256, 512, 1024 and 2048 tokens (batch 1): the fused path's peak should grow linearly with the
 * sequence length, the unfused path's grows with its square ([B, H, T, T] weights).
 *
 * One JSON line per measurement, then a summary.
 *   build/bench/attention [--reps 5] [--tokens 1024] [--batches 1,2,4,8] [--memory-tokens 256,512,1024,2048]
 */
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <cohort/cohort.h>
#include <cohort/core/tensor/allocator.h>

namespace {

using namespace cohort;
using Clock = std::chrono::steady_clock;

constexpr int64_t kHeads = 6;
constexpr int64_t kHeadDim = 64;

double cpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> parseList(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

Tensor causalMask(int64_t T) {
  Tensor m = zeros({T, T});
  float* p = m.data<float>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) p[i * T + j] = -std::numeric_limits<float>::infinity();
  return m;
}

struct Inputs {
  Tensor q, k, v, gradOut, mask;
};

Inputs makeInputs(int64_t B, int64_t T) {
  Generator g(1);
  const Shape s = {B, kHeads, T, kHeadDim};
  Inputs in;
  in.q = randn(s, {}, &g).setRequiresGrad();
  in.k = randn(s, {}, &g).setRequiresGrad();
  in.v = randn(s, {}, &g).setRequiresGrad();
  in.gradOut = randn(s, {}, &g);
  in.mask = causalMask(T);
  return in;
}

// Forward + backward of one path; gradients are cleared afterwards (outside any timing that
// matters: freeing is cheap).
void step(Inputs& in, bool fused) {
  Tensor y;
  if (fused) {
    y = nn::functional::scaledDotProductAttention(in.q, in.k, in.v, {.causal = true});
  } else {
    Tensor att = matmul(in.q, in.k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(kHeadDim)));
    att = att + in.mask;
    att = nn::functional::softmax(att, -1);
    y = matmul(att, in.v);
  }
  y.backward(in.gradOut);
  for (Tensor* t : {&in.q, &in.k, &in.v}) t->setGrad(Tensor());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int64_t tokens = 1024;
  std::vector<int64_t> batches = {1, 2, 4, 8}, memTokens = {256, 512, 1024, 2048};
  for (int i = 1; i < argc; ++i) {
    const bool hasValue = i + 1 < argc;
    if (!std::strcmp(argv[i], "--reps") && hasValue) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tokens") && hasValue) tokens = std::max<int64_t>(1, std::atoll(argv[++i]));
    else if (!std::strcmp(argv[i], "--batches") && hasValue) batches = parseList(argv[++i]);
    else if (!std::strcmp(argv[i], "--memory-tokens") && hasValue) memTokens = parseList(argv[++i]);
    else {
      std::fprintf(stderr, "usage: attention [--reps 5] [--tokens 1024] [--batches 1,2,4,8] "
                           "[--memory-tokens 256,512,1024,2048]\n");
      return 2;
    }
  }
  blas::setNumThreads(1);
  std::printf("# fused vs unfused causal attention, H=%lld E=%lld float32, 1 thread; %s\n",
              static_cast<long long>(kHeads), static_cast<long long>(kHeadDim), blas::describe().c_str());

  struct Timing {
    int64_t batch;
    double fusedCpu, unfusedCpu, fusedWall, unfusedWall;
  };
  std::vector<Timing> timings;
  for (int64_t B : batches) {
    Inputs in = makeInputs(B, tokens);
    step(in, true);  // warm-up: BLAS kernels, allocator, page tables
    step(in, false);
    std::vector<double> fc, uc, fw, uw;
    for (int r = 0; r < reps; ++r) {
      for (bool fused : {true, false}) {
        const double c0 = cpuNow();
        const auto w0 = Clock::now();
        step(in, fused);
        const double cpu = cpuNow() - c0;
        const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
        (fused ? fc : uc).push_back(cpu);
        (fused ? fw : uw).push_back(wall);
      }
    }
    Timing t{B, median(fc), median(uc), median(fw), median(uw)};
    timings.push_back(t);
    for (bool fused : {true, false})
      std::printf("{\"bench\": \"attention\", \"kind\": \"time\", \"path\": \"%s\", \"batch\": %lld, \"heads\": %lld, "
                  "\"tokens\": %lld, \"head_dim\": %lld, \"causal\": true, \"threads\": 1, \"reps\": %d, "
                  "\"fwd_bwd_ms_cpu\": %.3f, \"fwd_bwd_ms_wall\": %.3f}\n",
                  fused ? "fused" : "unfused", static_cast<long long>(B), static_cast<long long>(kHeads),
                  static_cast<long long>(tokens), static_cast<long long>(kHeadDim), reps,
                  1e3 * (fused ? t.fusedCpu : t.unfusedCpu), 1e3 * (fused ? t.fusedWall : t.unfusedWall));
    std::printf("{\"bench\": \"attention\", \"kind\": \"speedup\", \"batch\": %lld, \"tokens\": %lld, "
                "\"unfused_over_fused_cpu\": %.3f, \"unfused_over_fused_wall\": %.3f, \"goal\": 2.0}\n",
                static_cast<long long>(B), static_cast<long long>(tokens), t.unfusedCpu / t.fusedCpu,
                t.unfusedWall / t.fusedWall);
    std::fflush(stdout);
  }

  struct Peak {
    int64_t tokens;
    int64_t fused, unfused;
  };
  std::vector<Peak> peaks;
  for (int64_t T : memTokens) {
    Peak p{T, 0, 0};
    for (bool fused : {true, false}) {
      Inputs in = makeInputs(1, T);
      resetPeakMemory();
      const int64_t base = memoryStats().bytesLive;
      step(in, fused);
      (fused ? p.fused : p.unfused) = memoryStats().peakBytes - base;
      std::printf("{\"bench\": \"attention\", \"kind\": \"memory\", \"path\": \"%s\", \"batch\": 1, \"heads\": %lld, "
                  "\"tokens\": %lld, \"head_dim\": %lld, \"peak_bytes\": %lld}\n",
                  fused ? "fused" : "unfused", static_cast<long long>(kHeads), static_cast<long long>(T),
                  static_cast<long long>(kHeadDim), static_cast<long long>(fused ? p.fused : p.unfused));
    }
    peaks.push_back(p);
    std::fflush(stdout);
  }

  std::printf("\nforward + backward, causal, %lld tokens, H=%lld, E=%lld, 1 thread (median of %d, CPU time)\n",
              static_cast<long long>(tokens), static_cast<long long>(kHeads), static_cast<long long>(kHeadDim), reps);
  std::printf("%6s %12s %12s %9s %11s %6s\n", "batch", "fused ms", "unfused ms", "speedup", "wall ratio", "goal");
  bool allMet = true;
  for (const Timing& t : timings) {
    const double ratio = t.unfusedCpu / t.fusedCpu;
    allMet = allMet && ratio >= 2.0;
    std::printf("%6lld %12.2f %12.2f %8.2fx %10.2fx %6s\n", static_cast<long long>(t.batch), 1e3 * t.fusedCpu,
                1e3 * t.unfusedCpu, ratio, t.unfusedWall / t.fusedWall, ratio >= 2.0 ? "met" : "MISSED");
  }
  std::printf("\npeak memory of forward + backward above the inputs, batch 1 (MiB)\n");
  std::printf("%7s %10s %12s %14s %16s\n", "tokens", "fused", "unfused", "fused growth", "unfused growth");
  for (size_t i = 0; i < peaks.size(); ++i) {
    const Peak& p = peaks[i];
    std::string fg = "-", ug = "-";
    if (i > 0) {
      const double tr = static_cast<double>(p.tokens) / static_cast<double>(peaks[i - 1].tokens);
      fg = fmt::format("{:.2f}x / {:.0f}x", static_cast<double>(p.fused) / static_cast<double>(peaks[i - 1].fused), tr);
      ug = fmt::format("{:.2f}x / {:.0f}x", static_cast<double>(p.unfused) / static_cast<double>(peaks[i - 1].unfused),
                       tr);
    }
    std::printf("%7lld %10.2f %12.2f %14s %16s\n", static_cast<long long>(p.tokens),
                static_cast<double>(p.fused) / 1048576.0, static_cast<double>(p.unfused) / 1048576.0, fg.c_str(),
                ug.c_str());
  }
  std::printf("(growth: peak ratio to the previous row / token ratio; linear memory grows as the tokens do)\n");
  std::printf("\nfused at least 2x faster at every batch: %s\n", allMet ? "yes" : "no");
  return 0;
}
