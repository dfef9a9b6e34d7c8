#include <cohort/core/util/parallel.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <cohort/core/blas/blas.h>

namespace cohort {

namespace {

thread_local bool tInChunk = false;

struct Job {
  FunctionRef<void(int64_t, int64_t)> fn;
  int64_t n = 0;
  int64_t chunk = 0;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex errorMu;
  std::exception_ptr error;

  // Takes chunks until none is left; the caller and every helper run this.
  void runChunks() {
    tInChunk = true;
    for (;;) {
      int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) break;
      int64_t begin = c * chunk;
      try {
        fn(begin, std::min(n, begin + chunk));
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMu);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    tInChunk = false;
  }
};

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) {
      helpers_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "cohort-intraop");
        loop();
      });
    }
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  int threads() const { return threads_; }

  // Runs the job with the helpers' help; false (nothing run) when another call holds the pool.
  bool tryRun(Job& job) {
    std::unique_lock<std::mutex> busy(runMu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    job.runChunks();
    // Every chunk done, and every helper out of the job: they touch it until they leave.
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [&] { return job.done.load(std::memory_order_acquire) == job.chunks && active_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      Job* job = job_;
      ++active_;
      lock.unlock();
      job->runChunks();
      lock.lock();
      --active_;
      finished_.notify_all();
    }
  }

  const int threads_;
  std::mutex runMu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

// In static storage, never destroyed: helpers must not be joined from static destructors at
// exit. A forked child has none of the parent's threads, and another parent thread may have held
// the mutex at the fork: the child handler constructs a fresh mutex and an empty pool pointer
// over the old ones (leaking the parent's pool, whose helpers are not there to join). It does so
// without allocating — malloc in a fork handler can deadlock under sanitizers' allocators.
alignas(std::mutex) unsigned char gPoolMuStorage[sizeof(std::mutex)];
alignas(std::shared_ptr<Pool>) unsigned char gPoolStorage[sizeof(std::shared_ptr<Pool>)];
std::mutex* gPoolMu = new (gPoolMuStorage) std::mutex;
std::shared_ptr<Pool>* gPool = new (gPoolStorage) std::shared_ptr<Pool>;

const bool kAtFork = [] {
  pthread_atfork(nullptr, nullptr, [] {
    gPoolMu = new (gPoolMuStorage) std::mutex;
    gPool = new (gPoolStorage) std::shared_ptr<Pool>;
  });
  return true;
}();

std::shared_ptr<Pool> poolFor(int threads) {
  std::lock_guard<std::mutex> lock(*gPoolMu);
  if (!*gPool || (*gPool)->threads() != threads) *gPool = std::make_shared<Pool>(threads);
  return *gPool;
}

}  // namespace

int intraOpThreads() { return blas::numThreads(); }

void parallelFor(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int threads = (n >= 2 * grain && !tInChunk) ? intraOpThreads() : 1;
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  Job job;
  job.fn = fn;
  job.n = n;
  // A few chunks per thread, so a helper that wakes late still finds work.
  job.chunks = std::clamp<int64_t>(n / grain, 1, int64_t{4} * threads);
  job.chunk = (n + job.chunks - 1) / job.chunks;
  job.chunks = (n + job.chunk - 1) / job.chunk;
  std::shared_ptr<Pool> pool = poolFor(threads);
  if (!pool->tryRun(job)) {
    fn(0, n);
    return;
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace cohort
