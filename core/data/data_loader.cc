#include <cohort/core/data/data_loader.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>

namespace cohort::data {

// Shared by the loader and a running iteration, so an iterator that outlives its loader (moved
// out of a function, say) still has somewhere to record the position.
struct DataLoader::State {
  std::shared_ptr<const Dataset> dataset;
  DataLoaderOptions options;
  const Sampler* sampler = nullptr;  // options.sampler, or the built-in one below
  SequentialSampler sequential;
  RandomSampler random;
  std::mutex mu;  // guards position and active
  DataPosition position;
  bool active = false;

  State(std::shared_ptr<const Dataset> d, DataLoaderOptions o)
      : dataset(std::move(d)), options(std::move(o)), random(options.seed) {
    sampler = options.sampler   ? options.sampler.get()
              : options.shuffle ? static_cast<const Sampler*>(&random)
                                : &sequential;
  }
  int64_t numSamples() const { return sampler->numSamples(dataset->size()); }
  int64_t numBatches() const {
    int64_t n = numSamples(), b = options.batchSize;
    return options.dropLast ? n / b : (n + b - 1) / b;
  }
};

// One pass over (the rest of) an epoch: the worker threads and the reorder buffer.
struct DataLoader::Run {
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<State> state;
  int64_t epoch = 0;
  int64_t numBatches = 0;
  std::vector<int64_t> indices;
  int64_t window = 1;  // batches allowed ahead of the consumer

  std::mutex mu;
  std::condition_variable workersCv;   // consumer moved on, or stop
  std::condition_variable consumerCv;  // a batch arrived
  std::map<int64_t, Slot> ready;
  int64_t next = 0;  // the batch the consumer takes next
  bool stop = false;
  std::vector<std::thread> workers;

  Run(std::shared_ptr<State> s, DataPosition pos) : state(std::move(s)), epoch(pos.epoch), next(pos.batch) {
    const auto& o = state->options;
    indices = state->sampler->indices(state->dataset->size(), epoch);
    numBatches = state->numBatches();
    COHORT_CHECK_EQ(static_cast<int64_t>(indices.size()), state->numSamples(),
                    "DataLoader: sampler {} returned a list of the wrong length", state->sampler->describe());
    int n = o.numWorkers;
    window = static_cast<int64_t>(o.prefetchFactor) * n;
    const int64_t start = next;
    workers.reserve(static_cast<size_t>(n));
    try {
      for (int w = 0; w < n; ++w) workers.emplace_back([this, w, n, start] { work(start + w, n); });
    } catch (...) {
      shutdown();
      throw;
    }
  }

  ~Run() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    workersCv.notify_all();
    for (auto& t : workers)
      if (t.joinable()) t.join();
    workers.clear();
  }

  Batch build(int64_t b) {
    const int64_t bs = state->options.batchSize;
    const int64_t begin = b * bs;
    const int64_t end = std::min<int64_t>(begin + bs, static_cast<int64_t>(indices.size()));
    std::vector<Tensor> xs, ys;
    xs.reserve(static_cast<size_t>(end - begin));
    ys.reserve(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) {
      Example ex = state->dataset->get(indices[static_cast<size_t>(i)]);
      xs.push_back(std::move(ex.data));
      ys.push_back(std::move(ex.target));
    }
    return {stack(xs, 0), stack(ys, 0)};
  }

  void work(int64_t first, int64_t stride) {
    for (int64_t b = first; b < numBatches; b += stride) {
      {
        std::unique_lock<std::mutex> lock(mu);
        workersCv.wait(lock, [&] { return stop || b < next + window; });
        if (stop) return;
      }
      Slot slot;
      try {
        slot.batch = build(b);
      } catch (...) {
        slot.error = std::current_exception();
      }
      bool failed = slot.error != nullptr;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
        ready.emplace(b, std::move(slot));
      }
      consumerCv.notify_one();
      if (failed) return;  // the consumer stops at this batch
    }
  }

  // The next batch in order; nullopt at the end of the epoch.
  std::optional<Batch> take() {
    if (next >= numBatches) return std::nullopt;
    const int64_t b = next;
    Slot slot;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto have = [&] { return ready.count(b) != 0; };
      const auto timeout = state->options.timeout;
      if (timeout.count() > 0) {
        if (!consumerCv.wait_for(lock, timeout, have))
          throw TimeoutError(fmt::format("DataLoader: batch {} of epoch {} was not ready after {} ms ({}, {} workers)",
                                         b, epoch, timeout.count(), state->dataset->name(), state->options.numWorkers));
      } else {
        consumerCv.wait(lock, have);
      }
      auto it = ready.find(b);
      slot = std::move(it->second);
      ready.erase(it);
      if (!slot.error) ++next;
    }
    if (slot.error) {
      try {
        std::rethrow_exception(slot.error);
      } catch (const Error& e) {
        // Keep the type callers may catch; add where it happened.
        rethrowWithContext(e, b);
      }
    }
    workersCv.notify_all();
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->position = b + 1 == numBatches ? DataPosition{epoch + 1, 0} : DataPosition{epoch, b + 1};
    }
    return std::move(slot.batch);
  }

  [[noreturn]] void rethrowWithContext(const Error& e, int64_t b) {
    std::string where =
        fmt::format(" (DataLoader: building batch {} of epoch {} from {})", b, epoch, state->dataset->name());
    std::string msg = e.what() + where;
    if (dynamic_cast<const IndexError*>(&e)) throw IndexError(msg);
    if (dynamic_cast<const ValueError*>(&e)) throw ValueError(msg);
    if (dynamic_cast<const NotSupportedError*>(&e)) throw NotSupportedError(msg);
    if (dynamic_cast<const CheckpointError*>(&e)) throw CheckpointError(msg);
    throw;  // other cohort errors travel unchanged
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options) {
  COHORT_CHECK_T(ValueError, dataset != nullptr, "DataLoader: the dataset is null");
  COHORT_CHECK_T(ValueError, options.batchSize >= 1, "DataLoader: batchSize must be >= 1, got {}", options.batchSize);
  COHORT_CHECK_T(ValueError, options.numWorkers >= 1, "DataLoader: numWorkers must be >= 1, got {}",
                 options.numWorkers);
  COHORT_CHECK_T(ValueError, options.prefetchFactor >= 1, "DataLoader: prefetchFactor must be >= 1, got {}",
                 options.prefetchFactor);
  COHORT_CHECK_T(ValueError, options.timeout.count() >= 0, "DataLoader: timeout must be >= 0 ms, got {}",
                 options.timeout.count());
  if (options.sampler && options.shuffle && !options.sampler->shuffles())
    throw ValueError(
        fmt::format("DataLoader: shuffle = true, but the sampler {} does not shuffle", options.sampler->describe()));
  state_ = std::make_shared<State>(std::move(dataset), std::move(options));
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

DataLoader::Iterator::Iterator(std::unique_ptr<Run> run) : run_(std::move(run)) {}
DataLoader::Iterator::Iterator(Iterator&&) noexcept = default;
DataLoader::Iterator& DataLoader::Iterator::operator=(Iterator&&) noexcept = default;

DataLoader::Iterator::~Iterator() {
  if (!run_) return;
  std::shared_ptr<State> state = run_->state;
  run_.reset();  // stops and joins the workers
  std::lock_guard<std::mutex> lock(state->mu);
  state->active = false;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  COHORT_CHECK(!done_ && run_, "DataLoader::Iterator: incremented past the end");
  std::optional<Batch> b = run_->take();
  if (b) {
    *current_ = std::move(*b);
  } else {
    done_ = true;
    current_.reset();
  }
  return *this;
}

DataLoader::Iterator DataLoader::begin() {
  DataPosition pos;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->active)
      throw Error("DataLoader: begin() while another iteration over this loader is still alive; "
                  "finish or destroy the first iterator");
    state_->active = true;
    pos = state_->position;
  }
  std::unique_ptr<Run> run;
  try {
    run = std::make_unique<Run>(state_, pos);
  } catch (...) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->active = false;
    throw;
  }
  Iterator it(std::move(run));
  it.done_ = false;
  it.current_ = std::make_unique<Batch>();
  ++it;  // a failure here destroys `it`, which clears `active`
  return it;
}

int64_t DataLoader::numBatches() const { return state_->numBatches(); }
int64_t DataLoader::numSamples() const { return state_->numSamples(); }

DataPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->position;
}

void DataLoader::setPosition(DataPosition p) {
  const int64_t nb = numBatches();
  if (p.epoch < 0 || p.batch < 0 || p.batch > nb)
    throw ValueError(
        fmt::format("DataLoader::setPosition: position (epoch {}, batch {}) is outside an epoch of {} batches", p.epoch,
                    p.batch, nb));
  if (p.batch == nb && nb > 0) p = {p.epoch + 1, 0};
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->active) throw Error("DataLoader::setPosition: called while an iteration over this loader is alive");
  state_->position = p;
}

std::vector<int64_t> DataLoader::epochIndices(int64_t epoch) const {
  return state_->sampler->indices(state_->dataset->size(), epoch);
}

const Dataset& DataLoader::dataset() const { return *state_->dataset; }
const DataLoaderOptions& DataLoader::options() const { return state_->options; }

}  // namespace cohort::data
