#include <cohort/distributed/detail/op_queue.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>

#include <cohort/core/util/check.h>

namespace cohort::dist {

namespace {
void failDestroyed(Work::CompletionKey key, const WorkPtr& work) {
  work->fail(key, work->distError("the process group was destroyed before the op ran"));
}
}  // namespace

OpQueue::OpQueue(Work::CompletionKey key, int threads) : state_(std::make_shared<State>(key)) {
  COHORT_CHECK(threads >= 1, "OpQueue: {} threads", threads);
  state_->threads = threads;
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([state = state_] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      loop(state);
    });
  }
}

OpQueue::~OpQueue() { stop(); }

void OpQueue::post(WorkPtr work, std::function<void()> task, OpFootprint footprint) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->stop) {
      state_->queue.push_back(Item{std::move(work), std::move(task), std::move(footprint)});
      state_->cv.notify_all();
      return;
    }
  }
  failDestroyed(state_->key, work);
}

void OpQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  for (auto& w : workers_) {
    if (!w.joinable()) continue;
    // Destroyed from one of its own tasks (see op_queue.h): that worker ends on its own.
    if (w.get_id() == std::this_thread::get_id()) w.detach();
    else w.join();
  }
}

bool OpQueue::State::headCanStart() const {
  if (queue.empty() || exclusiveRunning || running >= threads) return false;
  const OpFootprint& f = queue.front().footprint;
  if (f.exclusive) return running == 0;
  return std::none_of(f.storages.begin(), f.storages.end(),
                      [&](const void* s) { return std::find(inFlight.begin(), inFlight.end(), s) != inFlight.end(); });
}

void OpQueue::loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  std::unique_lock<std::mutex> lock(s.mu);
  while (true) {
    s.cv.wait(lock, [&] { return s.stop || s.headCanStart(); });
    if (s.stop) {
      if (s.queue.empty()) return;  // stopped, nothing left
      Item item = std::move(s.queue.front());
      s.queue.pop_front();
      lock.unlock();
      failDestroyed(s.key, item.work);
      item = Item{};
      lock.lock();
      continue;
    }
    Item item = std::move(s.queue.front());
    s.queue.pop_front();
    ++s.running;
    if (item.footprint.exclusive) s.exclusiveRunning = true;
    s.inFlight.insert(s.inFlight.end(), item.footprint.storages.begin(), item.footprint.storages.end());
    lock.unlock();
    item.task();
    OpFootprint footprint = std::move(item.footprint);
    item = Item{};  // the task's captures go here, outside the lock (they may destroy the queue's owner)
    lock.lock();
    --s.running;
    if (footprint.exclusive) s.exclusiveRunning = false;
    for (const void* p : footprint.storages) s.inFlight.erase(std::find(s.inFlight.begin(), s.inFlight.end(), p));
    s.cv.notify_all();
  }
}

}  // namespace cohort::dist
