/*
 * DataLoader: batches of a Dataset, produced ahead of the training loop by background threads.
 *
 *   data::DataLoader loader(data::digits("train"), {.batchSize = 64, .shuffle = true, .seed = 1});
 *   for (auto& [x, y] : loader) { ... }            // x: [64, 64] float32, y: [64] int64
 *
 * Order. An epoch visits the indices of the sampler (options.sampler, e.g. a DistributedSampler),
 * else a seeded permutation (shuffle: torchRandperm(n, seed + epoch)), else 0..n-1; batch b holds
 * indices [b * batchSize, (b + 1) * batchSize) of that list, the last one shorter unless dropLast.
 * Batches are a pure function of (dataset, options, epoch, b): the same for any numWorkers, on
 * every run.
 *
 * Position. The loader remembers where it is: position() = {epoch, batch} is the next batch a
 * loop will yield. Handing out the last batch of epoch e moves it to {e + 1, 0}; so a plain
 * `for` loop visits one epoch and the next `for` loop the next epoch, a loop left early (break,
 * exception) is continued by the next loop, and saving position() in a checkpoint and
 * setPosition() after loading resumes with exactly the batch that would have come next.
 *
 * Threads. begin() starts numWorkers threads; worker w builds batches start+w, start+w+N, ...
 * (get() per example, then stack), at most prefetchFactor * numWorkers batches ahead of the
 * consumer (a bounded queue). The consumer takes them in order. Every wait has a shutdown path:
 * destroying the iterator (end of loop, break, exception) stops and joins the workers (a worker
 * inside Dataset::get finishes that call first). An exception thrown while building batch b is
 * rethrown by the consumer when it reaches batch b (with the batch and dataset named), and the
 * position stays at b. With options.timeout > 0, waiting longer than that for one batch throws
 * TimeoutError. One iteration at a time per loader: a second begin() while an iterator is alive
 * is an Error. A DataLoader is used from one thread; Dataset::get must be thread-safe.
 */
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include <cohort/core/data/dataset.h>
#include <cohort/core/data/sampler.h>

namespace cohort::data {

struct Batch {
  Tensor data;    // the examples' data stacked along a new first dim
  Tensor target;  // the examples' targets stacked likewise
};

// Where a loader is: the next batch it yields is batch `batch` of epoch `epoch`.
struct DataPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const DataPosition&) const = default;
};

struct DataLoaderOptions {
  int64_t batchSize = 1;
  // Shuffle each epoch (seed + epoch). With a sampler, the sampler orders the indices and
  // shuffle = true only asserts that it shuffles (a non-shuffling sampler is then a ValueError).
  bool shuffle = false;
  uint64_t seed = 0;
  bool dropLast = false;                 // drop a last batch smaller than batchSize
  SamplerRef sampler{};                  // e.g. DistributedSampler({.rank = r, .worldSize = w})
  int numWorkers = 1;                    // >= 1 background threads
  int prefetchFactor = 2;                // batches in flight per worker (>= 1)
  std::chrono::milliseconds timeout{0};  // > 0: longest wait for one batch before TimeoutError
};

class DataLoader {
  struct State;
  struct Run;

 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  template <typename D>
  requires std::derived_from<std::remove_cvref_t<D>, Dataset> DataLoader(D&& dataset, DataLoaderOptions options = {})
      : DataLoader(std::shared_ptr<const Dataset>(std::make_shared<std::remove_cvref_t<D>>(std::forward<D>(dataset))),
                   std::move(options)) {}
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator(Iterator&&) noexcept;
    Iterator& operator=(Iterator&&) noexcept;
    ~Iterator();
    Batch& operator*() const { return *current_; }
    Batch* operator->() const { return current_.get(); }
    Iterator& operator++();
    bool operator==(std::default_sentinel_t) const { return done_; }

   private:
    friend class DataLoader;
    explicit Iterator(std::unique_ptr<Run> run);
    std::unique_ptr<Run> run_;
    std::unique_ptr<Batch> current_;
    bool done_ = true;
  };

  // Starts (or continues) the epoch at position(); see the header comment.
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

  int64_t numBatches() const;  // batches per epoch
  int64_t numSamples() const;  // indices per epoch (the sampler's share on this rank)
  DataPosition position() const;
  // ValueError when batch is outside [0, numBatches()] or epoch < 0; Error while iterating.
  // {e, numBatches()} is stored as {e + 1, 0}.
  void setPosition(DataPosition position);
  void setEpoch(int64_t epoch) { setPosition({epoch, 0}); }
  int64_t epoch() const { return position().epoch; }
  // The index list epoch `epoch` visits.
  std::vector<int64_t> epochIndices(int64_t epoch) const;
  const Dataset& dataset() const;
  const DataLoaderOptions& options() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace cohort::data
