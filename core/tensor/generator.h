/*
 * Generator: a seeded, reproducible random number source (Philox4x32-10, counter based), one
 * default per device. The same seed gives the same numbers on every run and machine: the stream
 * depends only on (seed, offset), and distributions are computed by cohort's own code, not by
 * the standard library's implementation-defined ones.
 * State {seed, offset} can be saved in a checkpoint and restored. A Generator is not
 * thread-safe by itself; the default generator takes a lock per call.
 */
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace cohort {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // number of 128-bit Philox blocks consumed
  bool operator==(const GeneratorState&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ULL) : seed_(seed) {}

  void manualSeed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  GeneratorState state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {seed_, offset_};
  }
  void setState(const GeneratorState& s) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = s.seed;
    offset_ = s.offset;
  }

  // Reserves `blocks` Philox blocks and returns the first block's counter; the caller then
  // generates them with philox(seed, counter + i) without holding the lock.
  uint64_t reserve(uint64_t blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t c = offset_;
    offset_ += blocks;
    return c;
  }

  // Four 32-bit random words for block `counter` under `seed`.
  static std::array<uint32_t, 4> philox(uint64_t seed, uint64_t counter);

  // Converts random bits to floats in [0, 1) (24 bits for float, 53 for double).
  static float toUniformFloat(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
  static double toUniformDouble(uint32_t hi, uint32_t lo) {
    uint64_t v = (static_cast<uint64_t>(hi) << 32 | lo) >> 11;
    return static_cast<double>(v) * (1.0 / 9007199254740992.0);
  }

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of the CPU.
Generator& defaultGenerator();
// Seeds the default generator (like torch.manual_seed).
void manualSeed(uint64_t seed);

}  // namespace cohort
