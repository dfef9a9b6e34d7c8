// The toy training of the launcher tests: an int64 state vector updated by an all-reduced
// "gradient" each step. Integer arithmetic makes the result exact whatever order the all-reduce
// sums in, so every rank, every restart and the reference computed here agree bit for bit.
#pragma once

#include <array>
#include <cstdint>

namespace cohort::launcher_test {

inline constexpr int kStateSize = 8;
using State = std::array<int64_t, kStateSize>;

inline State initialState() {
  State w{};
  for (int i = 0; i < kStateSize; ++i) w[i] = i + 1;
  return w;
}

inline int64_t localGrad(const State& w, int i, int rank, int step) {
  return (w[i] * (rank + 1) + step * 7 + i) % 1000003;
}

inline void applyUpdate(State& w, const State& summed) {
  for (int i = 0; i < kStateSize; ++i) w[i] = (w[i] + summed[i]) % 1000000007;
}

// What `steps` steps on `world` ranks give, computed in one process.
inline State reference(int world, int steps) {
  State w = initialState();
  for (int s = 1; s <= steps; ++s) {
    State g{};
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < kStateSize; ++i) g[i] += localGrad(w, i, r, s);
    }
    applyUpdate(w, g);
  }
  return w;
}

}  // namespace cohort::launcher_test
