#include <cohort/distributed/gloo/gloo_backend.h>

#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <algorithm>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <fmt/format.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/detail/abort_signal.h>
#include <cohort/distributed/detail/op_queue.h>
#include <cohort/distributed/gloo/detail/store_adapter.h>

namespace cohort::dist::gloo_backend {

COHORT_ENV_KNOB(kGlooHostname, "COHORT_GLOO_HOSTNAME", "",
                "Address gloo's TCP transport listens on (default: this host's name, else 127.0.0.1)");
COHORT_ENV_KNOB(kGlooIface, "COHORT_GLOO_IFACE", "", "Network interface gloo's TCP transport uses (e.g. eth0)");
COHORT_ENV_KNOB(kGlooThreads, "COHORT_GLOO_THREADS", "2",
                "Worker threads per gloo process group (1-16): allreduces on different memory run side by side");

namespace {

int glooThreads() {
  const int64_t n = kGlooThreads.integer();
  if (n < 1 || n > 16) throw ValueError(fmt::format("COHORT_GLOO_THREADS must be between 1 and 16, got {}", n));
  return static_cast<int>(n);
}

// One TCP device (one event-loop thread) per process, shared by every group's context.
// gloo writes to its sockets with writev, which cannot pass MSG_NOSIGNAL: a write to a peer
// that died raises SIGPIPE, whose default action kills the whole process before gloo can report
// the broken pipe as an error (seen as a survivor dying in the kill tests, about 1 run in 10).
// SIGPIPE is therefore blocked in every thread that does gloo I/O: our worker threads, and
// gloo's device loop thread, which inherits the mask of the thread that creates the device. A
// blocked SIGPIPE raised by a write stays pending in that thread and the write fails with EPIPE,
// which gloo reports. The process-wide disposition is left to the program.
void blockSigpipeInThisThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// SIGPIPE blocked for a scope on a thread that is not ours (the caller's: posting a send or a
// receive on an unbound buffer may write to the socket at once). A SIGPIPE a write raised in the
// scope is left pending on this thread; it is consumed before the old mask comes back, so that
// unblocking does not deliver it (the write's EPIPE is what reports the dead peer).
class SigpipeBlockedScope {
 public:
  SigpipeBlockedScope() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlockedScope() {
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      const timespec zero{0, 0};
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
        while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlockedScope(const SigpipeBlockedScope&) = delete;
  SigpipeBlockedScope& operator=(const SigpipeBlockedScope&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
};

std::shared_ptr<::gloo::transport::Device> sharedDevice() {
  static std::mutex mu;
  static std::shared_ptr<::gloo::transport::Device> device;
  std::lock_guard<std::mutex> lock(mu);
  if (device) return device;
  SigpipeBlockedScope noSigpipe;  // the device's loop thread inherits this mask
  ::gloo::transport::tcp::attr attr;
  if (auto iface = kGlooIface.raw()) {
    attr.iface = *iface;
  } else if (auto host = kGlooHostname.raw()) {
    attr.hostname = *host;
  } else {
    char name[256] = {0};
    if (gethostname(name, sizeof(name) - 1) == 0) attr.hostname = name;
  }
  try {
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    if (kGlooIface.raw() || kGlooHostname.raw()) {
      throw DistError(fmt::format("gloo: cannot create a TCP device on {}: {}",
                                  attr.iface.empty() ? attr.hostname : "interface " + attr.iface, e.what()));
    }
    // This host's name does not resolve to a usable address: a single-host job still works.
    ::gloo::transport::tcp::attr loopback;
    loopback.hostname = "127.0.0.1";
    device = ::gloo::transport::tcp::CreateDevice(loopback);
  }
  return device;
}

// How often the monitor looks at the abort signal, and how long an op must have been in flight
// before it does: ops that end sooner never touch the store.
constexpr auto kSignalPoll = std::chrono::milliseconds(250);

bool isTimeoutMessage(const std::string& what) {
  return what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos ||
         what.find("timeout") != std::string::npos;
}

}  // namespace

GlooBackend::GlooBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts)
    : Backend("gloo", rank, size), group_(opts.groupName), store_(store),
      ops_(std::make_unique<OpQueue>(completionKey(), glooThreads())) {
  auto device = sharedDevice();
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(opts.timeout);
  GlooStoreAdapter adapter(store, opts.timeout);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const cohort::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError(fmt::format("gloo: rank {} of group '{}' could not connect to its {} peers through {}: {}", rank,
                                opts.groupName, size - 1, store->describe(), e.what()));
  }
  context_ = std::move(context);
}

GlooBackend::~GlooBackend() {
  {
    std::lock_guard<std::mutex> lock(monitorMu_);
    monitorStop_ = true;
  }
  monitorCv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  ops_->stop();  // ops still queued fail: the group was destroyed before they ran
  {
    std::lock_guard<std::mutex> lock(p2pMu_);
    p2pStop_ = true;
  }
  p2pCv_.notify_all();
  for (auto& t : p2pThreads_) t.join();
}

void GlooBackend::enqueue(const WorkPtr& work, std::function<std::vector<Tensor>()> body) {
  enqueue(work, std::move(body), OpFootprint{});
}

void GlooBackend::enqueue(const WorkPtr& work, std::function<std::vector<Tensor>()> body, OpFootprint footprint) {
  if (isBroken()) {
    work->fail(completionKey(), brokenError());
    return;
  }
  startMonitor();
  ops_->post(
      work,
      [this, work, body = std::move(body)] {
        if (isBroken()) work->fail(completionKey(), brokenError());  // the group broke while this op was queued
        else runGuarded(work, body);
      },
      std::move(footprint));
}

bool GlooBackend::isBroken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_ != nullptr;
}

void GlooBackend::runGuarded(const WorkPtr& work, const std::function<std::vector<Tensor>()>& body) {
  std::vector<Tensor> outputs;
  enum class Kind { None, Timeout, Peer, Gloo } kind = Kind::None;
  std::string detail;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.push_back({work, std::chrono::steady_clock::now()});
  }
  try {
    outputs = body();
  } catch (const ::gloo::IoException& e) {
    kind = isTimeoutMessage(e.what()) ? Kind::Timeout : Kind::Peer;
    detail = fmt::format("gloo: {}", e.what());
  } catch (const ::gloo::Exception& e) {
    kind = Kind::Gloo;
    detail = fmt::format("gloo: {}", e.what());
  } catch (const ::gloo::EnforceNotMet& e) {
    // gloo's internal checks: seen when another op's failure closed the connections under this
    // one (epoll_ctl on a closed socket). Then the earlier failure is the cause; quote it.
    if (isBroken()) {
      error = brokenError();
    } else {
      kind = Kind::Gloo;
      detail = fmt::format("gloo: {}", e.what());
    }
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(running_.begin(), running_.end(), [&](const Running& r) { return r.work == work; });
    // Not there: the monitor failed it while gloo held this thread (another rank broke the group).
    if (it == running_.end()) return;
    running_.erase(it);
  }
  if (kind == Kind::None && !error) {
    work->finish(completionKey(), std::move(outputs));
    return;
  }
  if (kind != Kind::None) {
    // Close the connections before diagnosing (which waits a little for the peers' reports), so
    // peers blocked on this rank fail and report now.
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = broken_ == nullptr;
      if (first) diagnosing_ = true;
    }
    const std::string what = work->describe() + " failed: " + detail;
    breakWith(kind == Kind::Timeout ? std::make_exception_ptr(TimeoutError(what))
                                    : std::make_exception_ptr(DistError(what)));
    error = kind == Kind::Timeout ? work->timeoutError(detail)
            : kind == Kind::Peer  ? work->peerError(detail)
                                  : work->distError(detail);
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = error;  // later ops quote the diagnosed error
      if (first) diagnosing_ = false;
    }
    brokenCv_.notify_all();
  }
  work->fail(completionKey(), error);
}

void GlooBackend::breakWith(std::exception_ptr error, bool raiseSignal) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return;
    broken_ = error;
  }
  // Every rank stops, even those blocked on a live peer (see the header). Before closing, so that
  // the root cause is signalled, not a peer's error about the connections closed below.
  if (raiseSignal) {
    // The kind comes from the error's type: its message quotes the group's name, which may say
    // anything.
    bool timeout = false;
    std::string what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError& e) {
      timeout = true;
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    detail::raiseAbortSignal(*store_, group_, rank(), timeout, what);
  }
  // Closing our side makes peers blocked on this rank fail now rather than at their timeout.
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    // The group is already broken with `error`; failing to close early only delays peers to their timeout.
    COHORT_LOG(Warning,
               "gloo: closing connections after the group broke failed (peers will see their "
               "timeout instead): {}",
               e.what());
  } catch (...) {
    COHORT_LOG(Warning, "gloo: closing connections after the group broke failed with a non-standard exception");
  }
  // Point-to-point ops still waiting (on any peer) fail now, with the group's error.
  {
    std::lock_guard<std::mutex> lock(p2pMu_);
    for (auto* buffer : p2pWaiting_) abortWait(*buffer);
    for (auto& p : p2pQueue_) abortWait(*p.buffer);
  }
}

void GlooBackend::startMonitor() {
  std::call_once(monitorOnce_, [this] { monitor_ = std::thread([this] { monitorLoop(); }); });
}

bool GlooBackend::inFlightSince(std::chrono::steady_clock::time_point cutoff) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Running& r : running_)
      if (r.since <= cutoff) return true;
  }
  std::lock_guard<std::mutex> lock(p2pMu_);
  return !p2pWaiting_.empty();
}

void GlooBackend::monitorLoop() {
  std::unique_lock<std::mutex> lock(monitorMu_);
  while (!monitorCv_.wait_for(lock, kSignalPoll, [&] { return monitorStop_; })) {
    lock.unlock();
    if (!isBroken() && inFlightSince(std::chrono::steady_clock::now() - kSignalPoll)) {
      auto signal = detail::readAbortSignal(*store_, group_);
      if (signal && signal->from != rank()) stopForSignal(*signal);
    }
    lock.lock();
  }
}

void GlooBackend::stopForSignal(const detail::AbortSignal& signal) {
  const std::string why = fmt::format("rank {} of group '{}' stopped it: {}", signal.from, group_, signal.message);
  std::vector<WorkPtr> stuck;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = broken_ == nullptr;
    if (first) diagnosing_ = true;
    for (Running& r : running_) stuck.push_back(std::move(r.work));
    running_.clear();
  }
  breakWith(std::make_exception_ptr(DistError(why)), /*raiseSignal=*/false);
  std::exception_ptr diagnosed;
  for (const WorkPtr& work : stuck) {
    std::exception_ptr error = signal.timeout ? work->timeoutError(why) : work->peerError(why);
    if (!diagnosed) diagnosed = error;
    work->fail(completionKey(), error);
  }
  if (first) {
    std::lock_guard<std::mutex> lock(mu_);
    if (diagnosed) broken_ = diagnosed;  // later ops quote the diagnosed error
    diagnosing_ = false;
  }
  brokenCv_.notify_all();
}

void GlooBackend::abortWait(::gloo::transport::UnboundBuffer& buffer) {
  // Both: a buffer is a send's or a receive's, and aborting the other kind of wait is a no-op
  // that the next wait of that kind would see, which never comes.
  buffer.abortWaitRecv();
  buffer.abortWaitSend();
}

std::exception_ptr GlooBackend::brokenError() const {
  std::string first;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Bounded: the diagnosis reads the store, which may itself be gone.
    brokenCv_.wait_for(lock, std::chrono::seconds(2), [&] { return !diagnosing_; });
    try {
      std::rethrow_exception(broken_);
    } catch (const std::exception& e) {
      first = e.what();
    } catch (...) {
      first = "unknown error";
    }
  }
  return std::make_exception_ptr(
      PeerError(fmt::format("gloo backend of group '{}' was aborted by an earlier error: {}", group_, first)));
}

void GlooBackend::abort(const std::string& reason) { breakWith(std::make_exception_ptr(DistError(reason))); }

// ---- point to point ----------------------------------------------------------------------------

void GlooBackend::postP2P(const WorkPtr& work, const Tensor& tensor, int peer, int tag, bool isSend) {
  if (isBroken()) {  // not under mu_: brokenError() takes it
    work->fail(completionKey(), brokenError());
    return;
  }
  startMonitor();
  PendingP2P p{work, tensor, nullptr, peer, isSend};
  try {
    SigpipeBlockedScope noSigpipe;  // this is the caller's thread
    p.buffer = context_->createUnboundBuffer(tensor.dataPtr(), tensor.nbytes());
    if (isSend) p.buffer->send(peer, static_cast<uint64_t>(tag));
    else p.buffer->recv(peer, static_cast<uint64_t>(tag));
  } catch (const ::gloo::Exception& e) {
    work->fail(completionKey(), work->peerError(fmt::format("gloo: {}", e.what())));
    return;
  } catch (const ::gloo::EnforceNotMet& e) {
    work->fail(completionKey(), isBroken() ? brokenError() : work->distError(fmt::format("gloo: {}", e.what())));
    return;
  }
  std::lock_guard<std::mutex> lock(p2pMu_);
  p2pQueue_.push_back(std::move(p));
  if (p2pQueue_.size() > p2pIdle_) {
    p2pThreads_.emplace_back([this] {
      blockSigpipeInThisThread();
      p2pLoop();
    });
  } else {
    p2pCv_.notify_one();
  }
}

void GlooBackend::p2pLoop() {
  std::unique_lock<std::mutex> lock(p2pMu_);
  while (true) {
    if (p2pQueue_.empty() && !p2pStop_) {
      ++p2pIdle_;
      p2pCv_.wait(lock, [&] { return p2pStop_ || !p2pQueue_.empty(); });
      --p2pIdle_;
    }
    if (p2pQueue_.empty()) return;
    PendingP2P p = std::move(p2pQueue_.front());
    p2pQueue_.pop_front();
    p2pWaiting_.push_back(p.buffer.get());
    // A break after this point aborts the wait below; one before it is seen here.
    const bool brokenBefore = isBroken();
    lock.unlock();
    std::exception_ptr error;
    try {
      Millis left = p.work->remaining();
      bool done = !brokenBefore && (p.isSend ? p.buffer->waitSend(left) : p.buffer->waitRecv(left));
      if (!done) error = isBroken() ? brokenError() : p.work->distError("gloo: the transfer was aborted");
    } catch (const ::gloo::IoException& e) {
      error = isTimeoutMessage(e.what()) ? p.work->timeoutError(fmt::format("gloo: {}", e.what()))
                                         : p.work->peerError(fmt::format("gloo: {}", e.what()));
    } catch (const std::exception& e) {
      error = isBroken() ? brokenError() : p.work->distError(fmt::format("gloo: {}", e.what()));
    }
    {
      std::lock_guard<std::mutex> g(p2pMu_);
      std::erase(p2pWaiting_, p.buffer.get());
    }
    if (error) {
      // The buffer stays registered with gloo's pair after a timeout: keep it (and the tensor)
      // alive with the broken context rather than free memory gloo may still write.
      breakWith(error);
      p.work->fail(completionKey(), error);
      std::lock_guard<std::mutex> g(mu_);
      leaked_.push_back(std::move(p.buffer));
      leakedTensors_.push_back(p.tensor);
    } else {
      p.work->finish(completionKey(), {p.tensor});
    }
    lock.lock();
  }
}

void GlooBackend::send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) {
  postP2P(work, tensor, dst, opts.tag, true);
}

void GlooBackend::recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) {
  postP2P(work, tensor, src, opts.tag, false);
}

// ---- registration --------------------------------------------------------------------------

namespace {
const bool kRegistered = [] {
  registerBackend("gloo", [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    return std::make_shared<GlooBackend>(store, rank, size, opts);
  });
  return true;
}();
}  // namespace

}  // namespace cohort::dist::gloo_backend
