#include <cohort/core/data/sampler.h>

#include <limits>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::data {

std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed) {
  if (n < 0) throw ValueError(fmt::format("torchRandperm: n must be >= 0, got {}", n));
  std::vector<int64_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), int64_t{0});
  // at::mt19937 seeds like std::mt19937 with the low 32 bits; its output is the standard one.
  std::mt19937 gen(static_cast<uint32_t>(seed & 0xffffffffu));
  if (n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20)) {
    // aten/src/ATen/native/TensorFactories.cpp randperm_cpu, small-n branch.
    for (int64_t i = 0; i < n - 1; ++i) {
      int64_t z = static_cast<int64_t>(gen() % static_cast<uint32_t>(n - i));
      std::swap(r[i], r[z + i]);
    }
  } else {
    // Large-n branch: inside-out Fisher-Yates with random64() = (first << 32) | second.
    for (int64_t i = 0; i < n; ++i) {
      uint64_t hi = gen();
      uint64_t lo = gen();
      int64_t z = static_cast<int64_t>(((hi << 32) | lo) % static_cast<uint64_t>(i + 1));
      r[i] = r[z];
      r[z] = i;
    }
  }
  return r;
}

std::vector<int64_t> SequentialSampler::indices(int64_t datasetSize, int64_t) const {
  std::vector<int64_t> r(static_cast<size_t>(datasetSize));
  std::iota(r.begin(), r.end(), int64_t{0});
  return r;
}

std::vector<int64_t> RandomSampler::indices(int64_t datasetSize, int64_t epoch) const {
  return torchRandperm(datasetSize, seed_ + static_cast<uint64_t>(epoch));
}

std::string RandomSampler::describe() const { return fmt::format("RandomSampler(seed={})", seed_); }

DistributedSampler::DistributedSampler(DistributedSamplerOptions options) : options_(options) {
  if (options_.worldSize < 1)
    throw ValueError(fmt::format("DistributedSampler: worldSize must be >= 1, got {}", options_.worldSize));
  if (options_.rank < 0 || options_.rank >= options_.worldSize)
    throw ValueError(fmt::format("DistributedSampler: invalid rank {}, rank should be in the interval [0, {}]",
                                 options_.rank, options_.worldSize - 1));
}

int64_t DistributedSampler::numSamples(int64_t n) const {
  const int64_t w = options_.worldSize;
  if (options_.dropLast && n % w != 0) {
    // torch: math.ceil((n - w) / w) with true division; n - w may be negative.
    int64_t a = n - w;
    return a >= 0 ? (a + w - 1) / w : -((-a) / w);
  }
  return (n + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::indices(int64_t n, int64_t epoch) const {
  if (n < 0) throw ValueError(fmt::format("DistributedSampler: dataset size must be >= 0, got {}", n));
  std::vector<int64_t> idx;
  if (options_.shuffle) {
    idx = torchRandperm(n, options_.seed + static_cast<uint64_t>(epoch));
  } else {
    idx.resize(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t{0});
  }
  const size_t total = static_cast<size_t>(totalSize(n));
  if (!options_.dropLast) {
    // indices += (indices * ceil(pad / len))[:pad], which repeats from the front.
    const size_t len = idx.size();
    for (size_t i = 0; idx.size() < total; ++i) idx.push_back(idx[i % len]);
  } else {
    idx.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(numSamples(n)));
  for (size_t i = static_cast<size_t>(options_.rank); i < total; i += static_cast<size_t>(options_.worldSize))
    mine.push_back(idx[i]);
  return mine;
}

std::string DistributedSampler::describe() const {
  return fmt::format("DistributedSampler(rank={}, worldSize={}, shuffle={}, seed={}, dropLast={})", options_.rank,
                     options_.worldSize, options_.shuffle, options_.seed, options_.dropLast);
}

}  // namespace cohort::data
