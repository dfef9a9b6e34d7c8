#include <cohort/distributed/op_queue.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>

#include <cohort/core/util/check.h>

namespace cohort::dist {

namespace {
void failDestroyed(const WorkPtr& work) {
  work->fail(work->distError("the process group was destroyed before the op ran"));
}
}  // namespace

OpQueue::OpQueue(int threads) {
  COHORT_CHECK(threads >= 1, "OpQueue: {} threads", threads);
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      loop();
    });
  }
}

OpQueue::~OpQueue() { stop(); }

void OpQueue::post(WorkPtr work, std::function<void()> task, OpFootprint footprint) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      queue_.push_back(Item{std::move(work), std::move(task), std::move(footprint)});
      cv_.notify_all();
      return;
    }
  }
  failDestroyed(work);
}

void OpQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
}

bool OpQueue::headCanStart() const {
  if (queue_.empty() || exclusiveRunning_ || running_ >= static_cast<int>(workers_.size())) return false;
  const OpFootprint& f = queue_.front().footprint;
  if (f.exclusive) return running_ == 0;
  return std::none_of(f.storages.begin(), f.storages.end(), [&](const void* s) {
    return std::find(inFlight_.begin(), inFlight_.end(), s) != inFlight_.end();
  });
}

void OpQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || headCanStart(); });
    if (stop_) {
      if (queue_.empty()) return;  // stopped, nothing left
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      failDestroyed(item.work);
      lock.lock();
      continue;
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    if (item.footprint.exclusive) exclusiveRunning_ = true;
    inFlight_.insert(inFlight_.end(), item.footprint.storages.begin(), item.footprint.storages.end());
    lock.unlock();
    item.task();
    item = Item{WorkPtr(), std::function<void()>(), std::move(item.footprint)};  // free the task's captures now
    lock.lock();
    --running_;
    if (item.footprint.exclusive) exclusiveRunning_ = false;
    for (const void* s : item.footprint.storages) inFlight_.erase(std::find(inFlight_.begin(), inFlight_.end(), s));
    cv_.notify_all();
  }
}

}  // namespace cohort::dist
