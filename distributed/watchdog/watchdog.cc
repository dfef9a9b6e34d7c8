#include <cohort/distributed/watchdog/watchdog.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/debug/detail/progress_publisher.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/detail/abort_signal.h>
#include <cohort/distributed/detail/op_args.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kWatchdogKill, "COHORT_WATCHDOG_KILL", "0",
                "1: when a communicator backend's watchdog (nccl) finds a timed-out or failed op, it dumps the flight "
                "recorders, aborts the communicators and ends the process with SIGABRT; 0: the error is raised at "
                "wait() on every rank");

bool watchdogKillFromEnv() { return kWatchdogKill.flag(); }

namespace {

// While ops are in flight the thread looks every kMinPoll at first and backs off to kMaxPoll
// while none completes: short ops are seen done within microseconds (a Work's completion is what
// a host-blocking wait() and future() callbacks wait for), long ones cost one query per 2 ms.
constexpr auto kMinPoll = std::chrono::microseconds(50);
constexpr auto kMaxPoll = std::chrono::microseconds(2000);
// The diagnosis rereads the peers' progress for at most this long (their publisher writes at most
// 200 ms late when idle), every kDiagnoseEvery, until no rank is missing.
constexpr Millis kDiagnoseFor{500};
constexpr Millis kDiagnoseEvery{50};

std::exception_ptr makeError(bool timeout, std::string msg) {
  if (timeout) return std::make_exception_ptr(TimeoutError(std::move(msg)));
  return std::make_exception_ptr(DistError(std::move(msg)));
}

}  // namespace

Watchdog::Watchdog(Work::CompletionKey key, WatchdogOptions opts) : key_(key), opts_(std::move(opts)) {}

Watchdog::~Watchdog() { stop(Millis(0)); }

void Watchdog::addCommunicator(CommunicatorPtr comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.push_back(std::move(comm));
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

void Watchdog::ensureThread() {
  if (thread_.joinable() || stopped_ || stop_) return;
  if (opts_.store) progress_ = std::make_shared<ProgressPublisher>(opts_.store, opts_.rank);
  thread_ = std::thread([this] { loop(); });
  threadId_ = thread_.get_id();
}

void Watchdog::track(const WorkPtr& work, CommCompletionPtr done, std::vector<Tensor> keepAlive,
                     std::vector<Tensor> outputs) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed) || stop_) {
    std::exception_ptr error =
        failed_.load(std::memory_order_relaxed)
            ? makeError(failTimeout_, fmt::format("{} failed at once: the communicator of group '{}' was aborted: {}",
                                                  work->describe(), opts_.group, failMessage_))
            : makeError(false, fmt::format("{} failed: the process group was destroyed before the op completed",
                                           work->describe()));
    lock.unlock();
    work->fail(key_, error);
    return;
  }
  ensureThread();
  const bool wake = items_.empty();
  items_.push_back(Item{work, std::move(done), std::move(keepAlive), std::move(outputs), false});
  if (wake) {
    // Only the first op of a busy period wakes the thread (it may sleep 250 ms when idle); while
    // ops are in flight it polls anyway, and a wake-up per op would cost a context switch each.
    tracked_ = true;
    lock.unlock();
    cv_.notify_one();
  }
}

std::exception_ptr Watchdog::errorFor(const Work& work) const {
  if (!failed()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return makeError(failTimeout_, fmt::format("{} failed at once: the communicator of group '{}' was aborted: {}",
                                             work.describe(), opts_.group, failMessage_));
}

void Watchdog::abortAll(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  if (!thread_.joinable() || stop_ || std::this_thread::get_id() == threadId_) {
    lock.unlock();
    fail(Kind::Abort, nullptr, reason, false);
    return;
  }
  // The watchdog's thread does it, so failures are handled one at a time, in one place.
  const uint64_t ticket = ++abortsRequested_;
  abortRequests_.push_back(reason);
  cv_.notify_all();
  abortCv_.wait(lock, [&] { return abortsHandled_ >= ticket || stopped_; });
}

bool Watchdog::stop(Millis drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return items_.empty();
    stop_ = true;
    drainUntil_ = std::chrono::steady_clock::now() + drain;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<Item> rest;
  std::vector<CommunicatorPtr> comms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(items_);
    comms = comms_;
    stopped_ = true;
  }
  abortCv_.notify_all();
  if (!rest.empty()) {
    // The ops may still touch their buffers: stop the communicators before the memory goes.
    for (auto& c : comms) c->abort();
    for (auto& item : rest) {
      item.work->fail(key_, makeError(false, fmt::format("{} failed: the process group was destroyed before the op "
                                                         "completed",
                                                         item.work->describe())));
    }
  }
  progress_.reset();
  return rest.empty();
}

void Watchdog::loop() {
  auto poll = std::chrono::duration_cast<std::chrono::microseconds>(kMinPoll);
  auto nextSignal = std::chrono::steady_clock::now() + opts_.signalPoll;
  uint64_t maxStarted = 0;
  std::vector<Item> finished;
  for (;;) {
    std::vector<std::string> aborts;
    std::optional<Item> timedOut;
    std::vector<CommunicatorPtr> comms;
    std::string queryError;
    bool stopNow = false;
    auto now = std::chrono::steady_clock::now();
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait = items_.empty() ? std::chrono::duration_cast<std::chrono::microseconds>(opts_.signalPoll) : poll;
      cv_.wait_for(lock, wait, [&] { return stop_ || !abortRequests_.empty() || tracked_; });
      if (tracked_) {
        tracked_ = false;
        poll = kMinPoll;
      }
      aborts.swap(abortRequests_);
      for (auto it = items_.begin(); it != items_.end();) {
        const uint64_t seq = it->work->sequenceNumber();
        bool done = false;
        try {
          if (!it->started && it->done->started()) it->started = true;
          done = it->done->done();
        } catch (const std::exception& e) {
          // The device reported an error through the op's events (a sticky CUDA error): as an
          // asynchronous error of the communicator, handled below, outside the lock.
          if (queryError.empty()) queryError = fmt::format("{}: {}", it->work->describe(), e.what());
        }
        if ((it->started || done) && seq > maxStarted) {
          // Sequence numbers only move forward in the published progress.
          maxStarted = seq;
          if (progress_) progress_->markStarted(seq);
        }
        if (done) {
          finished.push_back(std::move(*it));
          it = items_.erase(it);
        } else {
          ++it;
        }
      }
      now = std::chrono::steady_clock::now();
      if (!failed_.load(std::memory_order_relaxed)) {
        for (const Item& item : items_) {
          if (item.work->deadline() <= now) {
            timedOut = item;
            break;
          }
        }
      }
      comms = comms_;
      stopNow = stop_ && (items_.empty() || now >= drainUntil_);
    }
    for (Item& item : finished) {
      const uint64_t seq = item.work->sequenceNumber();
      if (progress_ && seq) progress_->markCompleted(seq);
      item.work->finish(key_, std::move(item.outputs));
    }
    poll = finished.empty() ? std::min<std::chrono::microseconds>(poll * 2, kMaxPoll) : kMinPoll;
    finished.clear();  // the tensors held for the ops go here, on this thread
    if (!failed() && !queryError.empty()) fail(Kind::AsyncError, nullptr, queryError, false);
    if (!failed()) {
      for (const auto& c : comms) {
        std::string err = c->asyncError();
        if (!err.empty()) {
          fail(Kind::AsyncError, nullptr, fmt::format("{}: {}", c->describe(), err), false);
          break;
        }
      }
    }
    if (timedOut && !failed()) fail(Kind::Timeout, timedOut->work, "", true);
    for (const std::string& reason : aborts) fail(Kind::Abort, nullptr, reason, false);
    if (!aborts.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      abortsHandled_ += aborts.size();
    }
    if (!aborts.empty()) abortCv_.notify_all();
    if (now >= nextSignal) {
      checkSignal();
      nextSignal = now + opts_.signalPoll;
    }
    if (stopNow) break;
  }
}

void Watchdog::fail(Kind kind, const WorkPtr& culpritIn, const std::string& why, bool timeout) {
  std::lock_guard<std::mutex> serial(failMu_);
  if (failed()) return;
  WorkPtr culprit = culpritIn;
  if (!culprit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!items_.empty()) culprit = items_.front().work;  // the oldest op still in flight
  }
  std::string msg;
  switch (kind) {
    case Kind::Timeout:
      msg = fmt::format("{} timed out after {} ms: its communicator did not complete it (watchdog)",
                        culprit->describe(), culprit->timeout().count());
      break;
    case Kind::AsyncError:
      msg = culprit ? fmt::format("{} failed: asynchronous communicator error: {}", culprit->describe(), why)
                    : fmt::format("group '{}': asynchronous communicator error: {}", opts_.group, why);
      break;
    case Kind::Abort:
      msg = culprit ? fmt::format("{} failed: the communicator was aborted: {}", culprit->describe(), why)
                    : fmt::format("group '{}': the communicator was aborted: {}", opts_.group, why);
      break;
    case Kind::Propagated: msg = culprit ? fmt::format("{} failed: {}", culprit->describe(), why) : why; break;
  }
  // 1. The evidence first, while every op is as it was.
  const std::string dumped = dumpFlightRecorders("watchdog: " + msg);
  // 2. Who is missing.
  if (kind == Kind::Timeout && culprit->sequenceNumber() > 0) {
    std::string why2 = diagnose(culprit->sequenceNumber());
    if (!why2.empty()) msg += "; " + why2;
  }
  // (A propagated message quotes the origin's, which names its dump: the same file in-process.)
  if (!dumped.empty() && msg.find(dumped) == std::string::npos) {
    msg += fmt::format(" (flight recorders dumped to {})", dumped);
  }
  // 3. Tell the other ranks (the first rank to fail names the root cause for all).
  if (kind != Kind::Propagated && opts_.store)
    detail::raiseAbortSignal(*opts_.store, opts_.group, opts_.rank, timeout, msg);
  std::vector<CommunicatorPtr> comms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms = comms_;
  }
  // 4. Opt-in: end the process, as c10d's async error handling does.
  if (opts_.killOnFailure) {
    for (auto& c : comms) c->abort();
    COHORT_LOG(Error, "rank {} of group '{}': {}; ending the process (COHORT_WATCHDOG_KILL=1)", opts_.rank, opts_.group,
               msg);
    std::abort();
  }
  // 5. Stop the communicators, so nothing stays blocked in them.
  for (auto& c : comms) c->abort();
  // 6. Every pending op fails; later ones fail at once (errorFor).
  std::deque<Item> items;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failTimeout_ = timeout;
    failMessage_ = msg;
    failed_.store(true, std::memory_order_release);
    items.swap(items_);
  }
  COHORT_LOG(Warning, "rank {} of group '{}': {}", opts_.rank, opts_.group, msg);
  for (Item& item : items) {
    const uint64_t seq = item.work->sequenceNumber();
    if (progress_ && seq) progress_->markFailed(seq);
    std::exception_ptr error =
        item.work == culprit
            ? makeError(timeout, msg)
            : makeError(timeout, fmt::format("{} failed: the communicator of group '{}' was aborted: {}",
                                             item.work->describe(), opts_.group, msg));
    item.work->fail(key_, error);
  }
  if (progress_) progress_->publish();
}

std::string Watchdog::diagnose(uint64_t seq) const {
  if (!opts_.store) return "";
  try {
    if (progress_) progress_->publish();
    auto name = [&](int r) { return op_args::rankName(r, opts_.globalRanks); };
    const auto until = std::chrono::steady_clock::now() + kDiagnoseFor;
    std::vector<std::string> missing, notes, unfinished;
    for (;;) {
      missing.clear();
      notes.clear();
      unfinished.clear();
      for (int r = 0; r < opts_.size; ++r) {
        const RankProgress dev = readProgress(*opts_.store, r);
        // Without the group's store, every rank counts as having issued it.
        const uint64_t issued = opts_.groupStore ? readProgress(*opts_.groupStore, r).started : seq;
        if (issued < seq) {
          missing.push_back(name(r));
          notes.push_back(fmt::format("rank {}: issued up to #{}", name(r), issued));
        } else if (dev.started < seq) {
          missing.push_back(name(r));
          notes.push_back(fmt::format("rank {}: issued up to #{}, its communicator started up to #{}", name(r), issued,
                                      dev.started));
        } else if (dev.completed < seq && r != opts_.rank) {
          unfinished.push_back(name(r));
        }
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(kDiagnoseEvery);
    }
    if (!missing.empty()) {
      return fmt::format("ranks that never arrived at it: [{}] ({})", fmt::join(missing, ", "), fmt::join(notes, "; "));
    }
    std::string out = "every rank arrived at it";
    if (!unfinished.empty())
      out += fmt::format("; other ranks that started it but did not finish: [{}]", fmt::join(unfinished, ", "));
    return out;
  } catch (const std::exception& e) {
    return fmt::format("(could not read the ranks' progress from the store: {})", e.what());
  }
}

void Watchdog::checkSignal() {
  if (!opts_.store || failed()) return;
  const auto signal = detail::readAbortSignal(*opts_.store, opts_.group);
  if (!signal || signal->from == opts_.rank) return;
  fail(Kind::Propagated, nullptr,
       fmt::format("rank {} of group '{}' aborted its communicator: {}",
                   op_args::rankName(signal->from, opts_.globalRanks), opts_.group, signal->message),
       signal->timeout);
}

}  // namespace cohort::dist
