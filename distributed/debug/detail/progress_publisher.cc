#include <cohort/distributed/debug/detail/progress_publisher.h>

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include <cohort/core/util/logging.h>

namespace cohort::dist {
namespace {

constexpr Millis kMinPublishInterval{20};
constexpr Millis kMaxPublishInterval{200};

std::string progressKey(int rank) { return fmt::format("progress/{}", rank); }

}  // namespace

RankProgress readProgress(Store& store, int rank) {
  const std::string key = progressKey(rank);
  RankProgress p;
  if (!store.check({key})) return p;
  std::istringstream in(store.getString(key));
  in >> p.started >> p.completed >> p.failed;
  return p;
}

ProgressPublisher::ProgressPublisher(StorePtr store, int rank) : store_(std::move(store)), key_(progressKey(rank)) {
  thread_ = std::thread([this] { loop(); });
}

ProgressPublisher::~ProgressPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string ProgressPublisher::value() const {
  return fmt::format("{} {} {}", started_.load(std::memory_order_relaxed), completed_.load(std::memory_order_relaxed),
                     failed_.load(std::memory_order_relaxed));
}

bool ProgressPublisher::publish() {
  std::lock_guard<std::mutex> plock(publishMu_);
  std::string v = value();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (v == published_) return false;
  }
  try {
    store_->set(key_, v);
  } catch (const std::exception& e) {
    // Best effort: at the end of a job rank 0 (and its store server) may be gone before the
    // others' last publish, which is not worth a warning on every rank. A diagnosis that needs
    // the store reports its own failure to read it.
    COHORT_LOG(Debug, "could not publish collective progress to {}: {}", store_->describe(), e.what());
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  published_ = std::move(v);
  return true;
}

void ProgressPublisher::loop() {
  Millis interval = kMinPublishInterval;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, interval, [&] { return stop_; });
    if (stop_) return;
    lock.unlock();
    bool wrote = publish();
    lock.lock();
    interval = wrote ? kMinPublishInterval : std::min(interval * 2, kMaxPublishInterval);
  }
}

}  // namespace cohort::dist
