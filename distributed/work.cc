#include <cohort/distributed/work.h>

#include <algorithm>

#include <fmt/format.h>

#include <cohort/core/profiler/record.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>

namespace cohort::dist {

namespace {
// After the deadline, wait() gives the backend this long to report its own error (which names
// the peer and carries the transport's detail) before it gives up and explains on its own.
constexpr Millis kBackendGrace{1000};

Millis effectiveTimeout(Millis t) { return t.count() < 0 ? kDefaultGroupTimeout : t; }
}  // namespace

Work::Work(OpType op, uint64_t seq, std::string groupName, Millis timeout, std::chrono::steady_clock::time_point start)
    : op_(op), seq_(seq), group_(std::move(groupName)), timeout_(effectiveTimeout(timeout)),
      deadline_(start + timeout_) {}

Millis Work::remaining() const {
  auto left = std::chrono::duration_cast<Millis>(deadline_ - std::chrono::steady_clock::now());
  return std::max(left, Millis(1));
}

std::string Work::describe() const {
  if (!label_.empty()) return fmt::format("{} ({}) in group '{}'", opTypeName(op_), label_, group_);
  return fmt::format("{} #{} in group '{}'", opTypeName(op_), seq_, group_);
}

std::string Work::diagnosis() const {
  if (!observer_) return "";
  try {
    return observer_->diagnose(*this);
  } catch (const std::exception& e) {
    return fmt::format("(could not ask the store which ranks are missing: {})", e.what());
  }
}

namespace {
std::string compose(const Work& w, const std::string& what, const std::string& detail) {
  std::string msg = fmt::format("{} {}", w.describe(), what);
  if (!detail.empty()) msg += ": " + detail;
  std::string why = w.diagnosis();
  if (!why.empty()) msg += "; " + why;
  return msg;
}
}  // namespace

std::exception_ptr Work::timeoutError(const std::string& detail) const {
  return std::make_exception_ptr(
      TimeoutError(compose(*this, fmt::format("timed out after {} ms", timeout_.count()), detail)));
}
std::exception_ptr Work::peerError(const std::string& detail) const {
  return std::make_exception_ptr(PeerError(compose(*this, "failed: a peer died or disconnected", detail)));
}
std::exception_ptr Work::distError(const std::string& detail) const {
  return std::make_exception_ptr(DistError(compose(*this, "failed", detail)));
}

void Work::recordProfiled(bool failed) const {
  const Profiled& p = *profiled_;
  std::vector<profiler::Arg> args = {profiler::Arg::str("group", group_),
                                     profiler::Arg::num("seq", static_cast<int64_t>(seq_)),
                                     profiler::Arg::num("rank", p.rank),
                                     profiler::Arg::str("backend", p.backend),
                                     profiler::Arg::num("bytes", p.bytes),
                                     profiler::Arg::str("shapes", p.shapes)};
  if (!p.detail.empty()) args.push_back(profiler::Arg::str("detail", p.detail));
  if (!label_.empty()) args.push_back(profiler::Arg::str("peer", label_));
  if (failed) args.push_back(profiler::Arg::str("state", "failed"));
  profiler::detail::recordSpan(profiler::EventKind::Collective, opTypeName(op_), "pg " + group_, p.startNs,
                               profiler::detail::nowNs(), std::move(args));
}

void Work::finish(CompletionKey, std::vector<Tensor> outputs) {
  if (profiled_) [[unlikely]]
    recordProfiled(false);
  if (observer_ && !observed_.exchange(true)) observer_->onComplete(*this, observerToken_, nullptr);
  complete(&outputs, nullptr);
}
void Work::fail(CompletionKey, std::exception_ptr error) {
  COHORT_CHECK(error != nullptr, "Work::fail needs an exception");
  if (profiled_) [[unlikely]]
    recordProfiled(true);
  if (observer_ && !observed_.exchange(true)) observer_->onComplete(*this, observerToken_, error);
  complete(nullptr, std::move(error));
}

void Work::complete(std::vector<Tensor>* outputs, std::exception_ptr error) {
  std::optional<Future<std::vector<Tensor>>> chained;
  {
    std::lock_guard<std::mutex> lock(mu_);
    COHORT_CHECK(state_.load(std::memory_order_relaxed) == kPending, "{} completed twice", describe());
    if (outputs) outputs_ = std::move(*outputs);
    error_ = std::move(error);
    state_.store(error_ ? kFailed : kSucceeded, std::memory_order_release);
    chained = future_;
  }
  cv_.notify_all();
  // outputs_ and error_ no longer change: the Future's callbacks run here, outside the lock.
  if (chained) {
    if (error_) {
      chained->setError(error_);
    } else {
      chained->setValue(outputs_);
    }
  }
}

Future<std::vector<Tensor>> Work::future() const {
  std::unique_lock<std::mutex> lock(mu_);
  if (future_) return *future_;
  Future<std::vector<Tensor>> f;
  future_ = f;
  const uint8_t s = state_.load(std::memory_order_relaxed);
  lock.unlock();
  // Completed before anyone asked: complete the new Future here (complete() saw no future_).
  if (s == kSucceeded) f.setValue(outputs_);
  if (s == kFailed) f.setError(error_);
  return f;
}

bool Work::waitUntilDone(std::chrono::steady_clock::time_point until) const {
  if (isCompleted()) return true;
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, until, [&] { return state_.load(std::memory_order_relaxed) != kPending; });
}

void Work::rethrowIfFailed() const {
  if (state_.load(std::memory_order_acquire) == kFailed) std::rethrow_exception(error_);
}

void Work::wait() {
  if (isCompleted()) {  // caller-thread backends: no clock read, no lock
    rethrowIfFailed();
    return;
  }
  if (deviceWait_) {  // stream-ordered (setDeviceWait): the host does not wait for the device
    deviceWait_();
    rethrowIfFailed();
    return;
  }
  profiler::detail::OpScope blocked;  // the time this thread spends blocked, in the trace
  if (profiler::detail::active()) [[unlikely]]
    blocked.beginKind(profiler::EventKind::Wait, "wait " + describe());
  if (waitUntilDone(std::max(deadline_, std::chrono::steady_clock::now()) + kBackendGrace)) {
    rethrowIfFailed();
    return;
  }
  abortOnce();
  // The abort normally makes the backend fail the op at once with its own error.
  if (waitUntilDone(std::chrono::steady_clock::now() + Millis(100))) {
    rethrowIfFailed();
    return;
  }
  std::rethrow_exception(timeoutError("wait() gave up: the backend did not complete the op"));
}

void Work::wait(Millis timeout) {
  profiler::detail::OpScope blocked;
  if (profiler::detail::active() && !isCompleted()) [[unlikely]]
    blocked.beginKind(profiler::EventKind::Wait, "wait " + describe());
  if (waitUntilDone(std::chrono::steady_clock::now() + timeout)) {
    rethrowIfFailed();
    return;
  }
  abortOnce();
  std::string msg = fmt::format("{} not finished after wait({} ms)", describe(), timeout.count());
  std::string why = diagnosis();
  if (!why.empty()) msg += "; " + why;
  throw TimeoutError(msg);
}

void Work::abortOnce() {
  std::call_once(abortOnce_, [&] {
    if (abort_) {
      abort_();
    } else if (auto b = abortBackend_.lock()) {
      b->abort(describe() + ": abandoned by wait() after its timeout");
    }
  });
}

std::vector<Tensor> Work::result() {
  wait();
  // After a stream-ordered wait the op may still be pending: outputs_ is not ours to read yet.
  if (deviceWait_ && !isCompleted()) return deviceOutputs_;
  return outputs_;
}

}  // namespace cohort::dist
