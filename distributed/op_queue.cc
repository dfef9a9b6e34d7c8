#include <cohort/distributed/op_queue.h>

#include <pthread.h>
#include <signal.h>

namespace cohort::dist {

namespace {
void failDestroyed(const WorkPtr& work) {
  work->fail(work->distError("the process group was destroyed before the op ran"));
}
}  // namespace

OpQueue::OpQueue() {
  worker_ = std::thread([this] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    loop();
  });
}

OpQueue::~OpQueue() { stop(); }

void OpQueue::post(WorkPtr work, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      queue_.emplace_back(std::move(work), std::move(task));
      cv_.notify_one();
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
  if (worker_.joinable()) worker_.join();
}

void OpQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, nothing left
    auto [work, task] = std::move(queue_.front());
    queue_.pop_front();
    const bool stopping = stop_;
    lock.unlock();
    if (stopping) failDestroyed(work);
    else task();
    lock.lock();
  }
}

}  // namespace cohort::dist
