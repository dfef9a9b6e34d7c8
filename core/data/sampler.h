/*
 * Samplers decide which dataset indices an epoch visits, in which order. A sampler is a pure
 * function of (dataset size, epoch) and its own options, so every rank and every run computes
 * the same lists without talking, and a resumed run recomputes the list it was in.
 *
 * DistributedSampler is torch.utils.data.DistributedSampler's algorithm exactly (same index
 * lists for the same n, world size, rank, shuffle, seed, epoch and drop_last): the shuffle is
 * torch.randperm(n) under a torch.Generator seeded with seed + epoch (torchRandperm below
 * reproduces it: std::mt19937, the same generator torch's CPU generator uses), padding repeats
 * indices from the front of the list, and rank r takes every worldSize-th index from r.
 * Samplers are immutable apart from setEpoch, and safe to share read-only between threads.
 */
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::data {

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist() on CPU (the low 32
// bits of seed seed the Mersenne Twister, as torch's manual_seed does).
std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed);

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices (into a dataset of `datasetSize` examples) visited in `epoch`, in order.
  virtual std::vector<int64_t> indices(int64_t datasetSize, int64_t epoch) const = 0;
  // indices(datasetSize, epoch).size() without building the list.
  virtual int64_t numSamples(int64_t datasetSize) const = 0;
  // Whether the order changes with the epoch (the DataLoader checks its shuffle option against it).
  virtual bool shuffles() const = 0;
  virtual std::string describe() const = 0;
};

// 0..n-1 in order.
class SequentialSampler : public Sampler {
 public:
  std::vector<int64_t> indices(int64_t datasetSize, int64_t epoch) const override;
  int64_t numSamples(int64_t datasetSize) const override { return datasetSize; }
  bool shuffles() const override { return false; }
  std::string describe() const override { return "SequentialSampler"; }
};

// A permutation of 0..n-1 per epoch: torchRandperm(n, seed + epoch).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(uint64_t seed = 0) : seed_(seed) {}
  std::vector<int64_t> indices(int64_t datasetSize, int64_t epoch) const override;
  int64_t numSamples(int64_t datasetSize) const override { return datasetSize; }
  bool shuffles() const override { return true; }
  std::string describe() const override;

 private:
  uint64_t seed_;
};

struct DistributedSamplerOptions {
  int64_t rank = 0;
  int64_t worldSize = 1;
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  // true: drop the tail so every rank gets floor-ish equal shares (torch: ceil((n - w) / w) each);
  // false: pad by repeating indices from the start so every rank gets ceil(n / w).
  bool dropLast = false;
};

class DistributedSampler : public Sampler {
 public:
  // ValueError when worldSize < 1 or rank is outside [0, worldSize).
  explicit DistributedSampler(DistributedSamplerOptions options);

  // The epoch indices(datasetSize) uses; a DataLoader passes its own epoch instead.
  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices(int64_t datasetSize) const { return indices(datasetSize, epoch_); }

  std::vector<int64_t> indices(int64_t datasetSize, int64_t epoch) const override;
  int64_t numSamples(int64_t datasetSize) const override;
  int64_t totalSize(int64_t datasetSize) const { return numSamples(datasetSize) * options_.worldSize; }
  bool shuffles() const override { return options_.shuffle; }
  std::string describe() const override;
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
};

// A shared, immutable sampler handle that any Sampler converts to, so options structs can say
// `.sampler = DistributedSampler({.rank = r, .worldSize = w})`.
class SamplerRef {
 public:
  SamplerRef() = default;
  SamplerRef(std::shared_ptr<const Sampler> s) : ptr_(std::move(s)) {}  // NOLINT(implicit)
  template <typename S>
  requires std::derived_from<std::remove_cvref_t<S>, Sampler> SamplerRef(S&& s)  // NOLINT(implicit)
      : ptr_(std::make_shared<std::remove_cvref_t<S>>(std::forward<S>(s))) {}
  explicit operator bool() const { return ptr_ != nullptr; }
  const Sampler* get() const { return ptr_.get(); }
  const Sampler* operator->() const { return ptr_.get(); }

 private:
  std::shared_ptr<const Sampler> ptr_;
};

}  // namespace cohort::data
