// The MPI backend's threads (worker, watchdog, send/recv poller), its construction and its
// registration as "mpi". The ops themselves are in mpi_collectives.cc and mpi_point_to_point.cc.
#include <cohort/distributed/mpi/mpi_backend.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/mpi/detail/mpi_state.h>

namespace cohort::dist::mpi_backend {

using Clock = std::chrono::steady_clock;

void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw MpiCallError(fmt::format("{} failed: {}", call, MpiEnvironment::errorString(rc)));
}

namespace {
// How often the watchdog looks at a collective running on its caller's thread (it is not woken
// per op: that would cost a context switch on the rank's core).
constexpr std::chrono::milliseconds kCallerPoll{20};

// Registered before main() runs; the registry is a function-local static, so order is safe.
const bool kRegistered = [] {
  registerBackend("mpi", [](const StorePtr&, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    return std::make_shared<MpiBackend>(rank, size, opts);
  });
  return true;
}();
}  // namespace

// ---- construction ----------------------------------------------------------------------------

MpiBackend::MpiBackend(int rank, int size, const BackendOptions& opts)
    : Backend("mpi", rank, size), state_(std::make_shared<State>()) {
  auto env = MpiEnvironment::get();
  std::vector<int> global = opts.globalRanks;
  if (global.empty()) {
    for (int i = 0; i < size; ++i) global.push_back(i);
  }
  if (static_cast<int>(global.size()) != size) {
    throw ValueError(fmt::format("backend mpi: group '{}' has size {} but lists {} world ranks", opts.groupName, size,
                                 global.size()));
  }
  if (global[rank] != env->worldRank() || size > env->worldSize()) {
    throw DistError(fmt::format(
        "backend mpi: group '{}' puts this process at world rank {} (world size {}), but MPI_COMM_WORLD has it as "
        "rank {} of {}. The mpi backend runs under mpirun, with ranks as MPI numbers them (initProcessGroup reads "
        "OMPI_COMM_WORLD_RANK/SIZE)",
        opts.groupName, global[rank], size, env->worldRank(), env->worldSize()));
  }
  for (int g : global) {
    if (g < 0 || g >= env->worldSize()) {
      throw ValueError(fmt::format("backend mpi: group '{}' lists world rank {}, outside MPI_COMM_WORLD of size {}",
                                   opts.groupName, g, env->worldSize()));
    }
  }
  state_->groupName = opts.groupName;
  state_->size = size;
  state_->onCaller = collectiveThreadFromEnv() == CollectiveThread::Caller;
  state_->comm = MpiComm::create(env, global, opts.groupName);
  if (state_->comm->rank() != rank || state_->comm->size() != size) {
    throw DistError(fmt::format("backend mpi: group '{}': the communicator has this process as rank {} of {}, "
                                "expected rank {} of {}",
                                opts.groupName, state_->comm->rank(), state_->comm->size(), rank, size));
  }
  state_->start();
}

MpiBackend::~MpiBackend() { state_->shutdown(); }

bool MpiBackend::supports(OpType) const { return true; }

void MpiBackend::abort(const std::string& reason) { state_->abortAll(reason); }

// ---- threads -----------------------------------------------------------------------------------

void MpiBackend::State::start() {
  auto self = shared_from_this();
  worker = std::thread([self] { self->workerLoop(); });
  monitor = std::thread([self] { self->monitorLoop(); });
  poller = std::thread([self] { self->pollerLoop(); });
}

void MpiBackend::State::push(std::shared_ptr<PendingOp> op) {
  bool wakeMonitor = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stop) throw DistError(fmt::format("backend mpi: group '{}' is shutting down", groupName));
    if (op->work->deadline() < monitorWake) wakeMonitor = true;
    queue.push_back(std::move(op));
  }
  workerCv.notify_one();
  if (wakeMonitor) monitorCv.notify_one();
}

void MpiBackend::State::enqueueOnWorker(const WorkPtr& work, OpFn fn) {
  auto op = std::make_shared<PendingOp>();
  op->work = work;
  op->run = std::move(fn);
  std::weak_ptr<State> weak = weak_from_this();
  Work* raw = work.get();  // the abort function lives in the Work: no cycle, and it outlives the call
  work->setAbort(completionKey(), [weak, raw] {
    if (auto s = weak.lock()) s->abortAll(fmt::format("{} was aborted after its wait timed out", raw->describe()));
  });
  push(std::move(op));
}

void MpiBackend::State::enqueueP2p(const WorkPtr& work, OpFn fn, std::shared_ptr<std::atomic<bool>> abortFlag) {
  auto op = std::make_shared<PendingOp>();
  op->work = work;
  op->run = std::move(fn);
  op->pointToPoint = true;
  op->p2pAbort = abortFlag;
  std::weak_ptr<State> weak = weak_from_this();
  // Only this transfer is cancelled: point-to-point ops do not keep the ranks in step.
  work->setAbort(completionKey(), [weak, abortFlag] {
    abortFlag->store(true);
    if (auto s = weak.lock()) s->p2pCv.notify_all();
  });
  push(std::move(op));
}

uint64_t MpiBackend::State::beginOnCaller(const WorkPtr& work) {
  if (broken.load(std::memory_order_acquire)) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu);
      reason = aborted ? abortReason : std::string("the backend was shut down");
    }
    work->fail(completionKey(), work->distError(fmt::format("not started: {}", reason)));
    return 0;
  }
  const uint64_t ticket = callerTickets.fetch_add(1, std::memory_order_relaxed) + 1;
  callerWork.store(&work, std::memory_order_relaxed);
  callerDeadline.store(work->deadline().time_since_epoch().count(), std::memory_order_relaxed);
  callerRunning.store(ticket, std::memory_order_release);  // the watchdog polls it: no wake-up per op
  return ticket;
}

void MpiBackend::State::endOnCaller(Work& work, uint64_t ticket, std::optional<std::vector<Tensor>> outputs,
                                    std::exception_ptr error) {
  uint64_t running = ticket;
  if (!callerRunning.compare_exchange_strong(running, 0) && running == (ticket | kCallerClaimed)) {
    // The watchdog gave up on this op and is ending the job. Let it take its reference to the
    // Work before this frame (which holds the caller's) goes away; it clears the slot at once.
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (callerRunning.load() == (ticket | kCallerClaimed) && Clock::now() < until) std::this_thread::yield();
    return;
  }
  // Otherwise the slot is ours (now cleared) or holds another thread's op: two threads issuing
  // collectives on one group at once (MPI needs one order on every rank, so programs should not;
  // the slot then watches the later one), and this op is completed as usual.
  if (error) {
    work.fail(completionKey(), std::move(error));
  } else {
    COHORT_CHECK(outputs.has_value(), "backend mpi: {} ran on its caller's thread but left no outputs",
                 work.describe());
    work.finish(completionKey(), std::move(*outputs));
  }
}

void MpiBackend::State::checkCallerDeadline(std::unique_lock<std::mutex>& lock, Clock::time_point now) {
  uint64_t ticket = callerRunning.load(std::memory_order_acquire);
  if (ticket == 0 || (ticket & kCallerClaimed)) return;
  const WorkPtr* work = callerWork.load(std::memory_order_relaxed);
  if (now.time_since_epoch().count() < callerDeadline.load(std::memory_order_relaxed)) return;
  // Tickets never repeat: if the slot still holds this one, the caller is still inside this op
  // (and `work` and the deadline read above are its own).
  if (!callerRunning.compare_exchange_strong(ticket, ticket | kCallerClaimed)) return;
  WorkPtr stuck = *work;
  callerRunning.store(0);
  lock.unlock();
  abortJobForStuckCaller(stuck);
}

void MpiBackend::State::abortJobForStuckCaller(const WorkPtr& work) {
  std::string msg;
  try {
    std::rethrow_exception(
        work->timeoutError("MPI cannot interrupt a blocking collective running on its caller's thread "
                           "(COHORT_COLLECTIVE_THREAD=caller), so this rank ends the job with MPI_Abort; with "
                           "COHORT_COLLECTIVE_THREAD=worker the timeout is an exception instead"));
  } catch (const std::exception& e) {
    msg = e.what();
  }
  COHORT_LOG(Error, "{}", msg);
  std::fprintf(stderr, "cohort: %s\n", msg.c_str());
  std::fflush(stderr);
  // Failing the Work marks its flight-recorder entry and, as for any DistError, dumps the recorders.
  work->fail(completionKey(), std::make_exception_ptr(TimeoutError(msg)));  // claimed by checkCallerDeadline
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; if it did, still never go back into a stuck job
}

void MpiBackend::State::runOne(const std::shared_ptr<PendingOp>& op) {
  std::optional<std::vector<Tensor>> outputs;
  std::exception_ptr error;
  try {
    auto lock = comm->env().lock();
    outputs = op->run(comm->get());
  } catch (const std::exception& e) {
    error = op->work->distError(e.what());
  }
  bool wasStuck = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    current.reset();
    wasStuck = currentStuck;
    currentStuck = false;
  }
  if (wasStuck) comm->env().unmarkStuck();  // it came back after all
  if (!error && !outputs) return;           // a send/recv: the poller completes it
  // Send/recv were claimed when the worker took them; collectives are claimed here, unless the
  // watchdog or an abort failed them already.
  if (!op->pointToPoint && !op->claim()) return;
  if (error) {
    op->work->fail(completionKey(), error);
  } else {
    op->work->finish(completionKey(), std::move(*outputs));
  }
}

void MpiBackend::State::workerLoop() {
  while (true) {
    std::shared_ptr<PendingOp> op;
    std::string reason;
    {
      std::unique_lock<std::mutex> lock(mu);
      workerCv.wait(lock, [&] { return !queue.empty() || stop; });
      if (queue.empty()) break;  // stop, and nothing left
      op = std::move(queue.front());
      queue.pop_front();
      if (aborted || stop) {
        reason = aborted ? abortReason : std::string("the backend was shut down");
      } else if (op->pointToPoint ? op->claim() : !op->completed.load()) {
        current = op;
      } else {
        continue;  // failed while queued (a send/recv past its deadline)
      }
    }
    if (!reason.empty()) {
      if (op->claim()) op->work->fail(completionKey(), op->work->distError(fmt::format("not started: {}", reason)));
      continue;
    }
    runOne(op);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    workerDone = true;
  }
  idleCv.notify_all();
}

void MpiBackend::State::monitorLoop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!(stop && workerDone)) {
    // The earliest deadline among the op in MPI and those queued behind it.
    std::shared_ptr<PendingOp> first;
    auto consider = [&](const std::shared_ptr<PendingOp>& op) {
      if (op && !op->completed.load() && (!first || op->work->deadline() < first->work->deadline())) first = op;
    };
    if (!currentStuck) consider(current);
    for (const auto& op : queue) consider(op);
    auto now = Clock::now();
    if (onCaller) checkCallerDeadline(lock, now);
    // In caller mode collectives come and go without telling the watchdog: look every kCallerPoll.
    auto pollLimit = onCaller ? now + kCallerPoll : Clock::time_point::max();
    if (!first) {
      monitorWake = Clock::time_point::max();
      if (onCaller) {
        monitorCv.wait_until(lock, pollLimit);
      } else {
        monitorCv.wait(lock);
      }
      continue;
    }
    if (now < first->work->deadline()) {
      monitorWake = first->work->deadline();
      monitorCv.wait_until(lock, std::min(monitorWake, pollLimit));
      continue;
    }
    if (first->pointToPoint) {
      // A send/recv that was never issued (issued ones are claimed, and the poller times them
      // out): fail it alone; the collectives behind it are unaffected. Claimed under the lock,
      // so the worker skips it.
      if (!first->claim()) continue;
      lock.unlock();
      first->work->fail(completionKey(), first->work->timeoutError("it was still queued behind other ops"));
      lock.lock();
      continue;
    }
    // A collective missed its deadline. MPI cannot cancel it, and running the ops behind it would
    // pair them with the wrong ops on the other ranks: abort the backend.
    std::vector<std::shared_ptr<PendingOp>> drop(queue.begin(), queue.end());
    queue.clear();
    std::shared_ptr<PendingOp> stuckOp;
    if (current && !currentStuck) {
      stuckOp = current;
      currentStuck = true;
    }
    aborted = true;
    broken.store(true);
    abortReason =
        fmt::format("{} timed out, so backend mpi of group '{}' was aborted", first->work->describe(), groupName);
    std::string reason = abortReason;
    lock.unlock();
    if (stuckOp) comm->env().markStuck();
    const std::string blocked =
        "MPI cannot cancel a blocking collective: this rank's MPI thread stays blocked in it and the backend is "
        "aborted (mpirun ends the job when a process exits)";
    if (stuckOp && stuckOp->claim()) stuckOp->work->fail(completionKey(), stuckOp->work->timeoutError(blocked));
    for (auto& op : drop) {
      if (!op->claim()) continue;
      if (op == first || Clock::now() >= op->work->deadline()) {
        op->work->fail(completionKey(), op->work->timeoutError(fmt::format("not started: {}", reason)));
      } else {
        op->work->fail(completionKey(), op->work->distError(fmt::format("not started: {}", reason)));
      }
    }
    lock.lock();
  }
}

void MpiBackend::State::abortAll(const std::string& reason) {
  std::vector<std::shared_ptr<PendingOp>> drop;
  std::shared_ptr<PendingOp> running;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!aborted) {
      aborted = true;
      abortReason = reason;
    }
    broken.store(true);
    drop.assign(queue.begin(), queue.end());
    queue.clear();
    if (current && !currentStuck) {
      running = current;
      currentStuck = true;
    }
  }
  monitorCv.notify_all();
  if (running) {
    comm->env().markStuck();
    if (running->claim()) {
      running->work->fail(completionKey(),
                          running->work->distError(fmt::format("{}; the op stays blocked inside MPI", reason)));
    }
  }
  for (auto& op : drop) {
    if (op->claim()) op->work->fail(completionKey(), op->work->distError(fmt::format("not started: {}", reason)));
  }
  p2pAbortAll.store(true);
  p2pCv.notify_all();
}

void MpiBackend::State::shutdown() {
  bool stuck = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    stop = true;
    broken.store(true);
    workerCv.notify_all();
    monitorCv.notify_all();
    // The worker finishes the op it is in (the other ranks are running it too) unless the
    // watchdog or an abort gave up on it: then it may never come back.
    idleCv.wait(lock, [&] { return workerDone || currentStuck; });
    // A timed-out op may still come back (its late peers arrived just now): give it a moment, so
    // the communicator is freed properly and MPI_Finalize runs at exit.
    if (!workerDone) idleCv.wait_for(lock, std::chrono::seconds(1), [&] { return workerDone; });
    stuck = !workerDone;
  }
  monitorCv.notify_all();
  if (stuck) {
    COHORT_LOG(Warning, "backend mpi: group '{}' destroyed while an op is blocked inside MPI; leaving its thread",
               groupName);
    worker.detach();
    comm->release();  // freeing a communicator in use is not allowed
    // The monitor waits for the worker: wake it for good.
    {
      std::lock_guard<std::mutex> lock(mu);
      workerDone = true;
    }
    monitorCv.notify_all();
  } else {
    worker.join();
  }
  monitor.join();
  {
    std::lock_guard<std::mutex> lock(p2pMu);
    p2pStop = true;
  }
  p2pCv.notify_all();
  poller.join();
}

// ---- send/recv completion ----------------------------------------------------------------------

void MpiBackend::State::addP2p(std::shared_ptr<P2pOp> op) {
  {
    std::lock_guard<std::mutex> lock(p2pMu);
    incoming.push_back(std::move(op));
  }
  p2pCv.notify_one();
}

void MpiBackend::State::pollerLoop() {
  std::vector<std::shared_ptr<P2pOp>> active;
  std::vector<MPI_Request> requests;
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
  int idle = 0;
  while (true) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(p2pMu);
      if (active.empty()) p2pCv.wait(lock, [&] { return !incoming.empty() || p2pStop; });
      for (auto& p : incoming) active.push_back(std::move(p));
      incoming.clear();
      stopping = p2pStop;
    }
    if (stopping) {
      // Nothing may write into a buffer after the backend is gone: cancel, give MPI a moment to
      // confirm, and keep the buffers of transfers it could not cancel alive for good.
      auto deadline = Clock::now() + std::chrono::milliseconds(200);
      for (auto& p : active) {
        if (p->request == MPI_REQUEST_NULL) continue;
        auto lock = comm->env().lock();
        if (!p->cancelled) MPI_Cancel(&p->request);
        int done = 0;
        while (!done && Clock::now() < deadline) {
          MPI_Test(&p->request, &done, MPI_STATUS_IGNORE);
          if (!done) std::this_thread::yield();
        }
        if (!done) {
          MPI_Request_free(&p->request);
          static std::mutex leakMu;
          static auto* leaked = new std::vector<Tensor>();  // NOLINT: intentionally never freed
          std::lock_guard<std::mutex> leakLock(leakMu);
          leaked->push_back(p->tensor);
        }
      }
      for (auto& p : active) {
        if (!p->cancelled) {
          p->work->fail(completionKey(), p->work->distError("the backend was shut down before the transfer completed"));
        }
      }
      return;
    }
    // Deadlines and aborts: ask MPI to cancel (the Work fails now; the request finishes later).
    auto now = Clock::now();
    std::vector<std::pair<std::shared_ptr<P2pOp>, bool>> toCancel;  // (op, timed out)
    for (auto& p : active) {
      if (p->cancelled) continue;
      bool timedOut = now >= p->work->deadline();
      if (timedOut || p2pAbortAll.load() || (p->abortRequested && p->abortRequested->load())) {
        p->cancelled = true;
        toCancel.emplace_back(p, timedOut);
      }
    }
    if (!toCancel.empty()) {
      {
        auto lock = comm->env().lock();
        for (auto& [p, t] : toCancel) MPI_Cancel(&p->request);
      }
      for (auto& [p, timedOut] : toCancel) {
        std::string what = fmt::format("MPI_{} of {} elements cancelled", p->isRecv ? "Irecv" : "Isend", p->count);
        p->work->fail(completionKey(), timedOut ? p->work->timeoutError(what) : p->work->distError("aborted; " + what));
      }
    }
    requests.resize(active.size());
    indices.resize(active.size());
    statuses.resize(active.size());
    for (size_t i = 0; i < active.size(); ++i) requests[i] = active[i]->request;
    int outcount = 0;
    int rc;
    {
      auto lock = comm->env().lock();
      rc = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &outcount, indices.data(), statuses.data());
    }
    if (outcount == MPI_UNDEFINED) outcount = 0;
    for (int k = 0; k < outcount; ++k) {
      auto& p = active[indices[k]];
      p->request = MPI_REQUEST_NULL;
      if (p->cancelled) continue;  // already failed
      int err = rc == MPI_ERR_IN_STATUS ? statuses[k].MPI_ERROR : rc;
      if (err != MPI_SUCCESS) {
        p->work->fail(completionKey(),
                      p->work->distError(fmt::format("MPI_{} failed: {}", p->isRecv ? "Irecv" : "Isend",
                                                     MpiEnvironment::errorString(err))));
        continue;
      }
      if (p->isRecv) {
        int got = 0;
        MPI_Get_count(&statuses[k], p->type, &got);
        if (got != p->count) {
          p->work->fail(completionKey(),
                        p->work->distError(fmt::format("received {} elements from rank {} (tag {}) into a tensor of {}",
                                                       got, p->peer, p->tag, p->count)));
          continue;
        }
      }
      p->work->finish(completionKey(), {p->tensor});
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [](const auto& p) { return p->request == MPI_REQUEST_NULL; }),
                 active.end());
    if (outcount > 0) {
      idle = 0;
    } else if (++idle > 64) {
      // Nothing moved: back off to at most 1 ms between looks (transfers progress inside MPI).
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 << std::min(idle - 64, 7))));
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace cohort::dist::mpi_backend
