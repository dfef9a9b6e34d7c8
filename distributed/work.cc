#include <cohort/distributed/work.h>

#include <algorithm>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::dist {

namespace {
// After the deadline, wait() gives the backend this long to report its own error (which names
// the peer and carries the transport's detail) before it gives up and explains on its own.
constexpr Millis kBackendGrace{1000};

Millis effectiveTimeout(Millis t) { return t.count() < 0 ? kDefaultGroupTimeout : t; }
}  // namespace

Work::Work(OpType op, uint64_t seq, std::string groupName, Millis timeout)
    : op_(op),
      seq_(seq),
      group_(std::move(groupName)),
      timeout_(effectiveTimeout(timeout)),
      deadline_(std::chrono::steady_clock::now() + timeout_) {}

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

void Work::finish(std::vector<Tensor> outputs) {
  if (observer_ && !observed_.exchange(true)) observer_->onComplete(*this, observerToken_, nullptr);
  future_.setValue(std::move(outputs));
}
void Work::fail(std::exception_ptr error) {
  if (observer_ && !observed_.exchange(true)) observer_->onComplete(*this, observerToken_, error);
  future_.setError(std::move(error));
}

void Work::wait() {
  if (future_.isCompleted()) {  // caller-thread backends: no clock read, no timed wait
    future_.wait();             // rethrows the op's error
    return;
  }
  auto now = std::chrono::steady_clock::now();
  auto left = deadline_ > now ? deadline_ - now : std::chrono::steady_clock::duration::zero();
  if (future_.waitFor(left + kBackendGrace)) {
    future_.wait();  // rethrows the op's error
    return;
  }
  std::call_once(abortOnce_, [&] {
    if (abort_) abort_();
  });
  // The abort normally makes the backend fail the op at once with its own error.
  if (future_.waitFor(Millis(100))) {
    future_.wait();
    return;
  }
  std::rethrow_exception(timeoutError("wait() gave up: the backend did not complete the op"));
}

void Work::wait(Millis timeout) {
  if (future_.waitFor(timeout)) {
    future_.wait();
    return;
  }
  std::call_once(abortOnce_, [&] {
    if (abort_) abort_();
  });
  std::string msg = fmt::format("{} not finished after wait({} ms)", describe(), timeout.count());
  std::string why = diagnosis();
  if (!why.empty()) msg += "; " + why;
  throw TimeoutError(msg);
}

}  // namespace cohort::dist
