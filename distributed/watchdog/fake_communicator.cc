#include <cohort/distributed/watchdog/fake_communicator.h>

#include <cstring>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/detail/reduce_kernels.h>

namespace cohort::dist {

const char* commOpKindName(CommOpKind k) {
  switch (k) {
    case CommOpKind::Allreduce: return "allreduce";
    case CommOpKind::Broadcast: return "broadcast";
    case CommOpKind::Reduce: return "reduce";
    case CommOpKind::Allgather: return "allgather";
    case CommOpKind::ReduceScatter: return "reduce_scatter";
    case CommOpKind::Send: return "send";
    case CommOpKind::Recv: return "recv";
  }
  return "?";
}

// One enqueue call: its ops and its completion (the Task is the CommCompletion handed out).
struct FakeCommunicator::Task : CommCompletion {
  std::vector<CommOp> ops;
  uint64_t index = 0;
  std::atomic<bool> hasStarted{false};
  std::atomic<bool> isDone{false};
  bool started() override { return hasStarted.load(std::memory_order_acquire); }
  bool done() override { return isDone.load(std::memory_order_acquire); }
};

std::shared_ptr<FakeCommWorld> FakeCommWorld::create(int size) {
  if (size < 1) throw ValueError(fmt::format("FakeCommWorld: size must be >= 1, got {}", size));
  return std::shared_ptr<FakeCommWorld>(new FakeCommWorld(size));
}

std::shared_ptr<FakeCommWorld> FakeCommWorld::shared(const std::string& id, int size) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<FakeCommWorld>> worlds;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = worlds.begin(); it != worlds.end();) it = it->second.expired() ? worlds.erase(it) : std::next(it);
  if (auto w = worlds[id].lock()) {
    if (w->size() != size) {
      throw ValueError(fmt::format("fake communicator world '{}' has {} ranks, asked for {}", id, w->size(), size));
    }
    return w;
  }
  auto w = create(size);
  worlds[id] = w;
  return w;
}

FakeCommunicator::FakeCommunicator(std::shared_ptr<FakeCommWorld> world, int rank, FakeCommOptions opts)
    : world_(std::move(world)), rank_(rank), opts_(std::move(opts)) {
  if (!world_) throw ValueError("FakeCommunicator: world is null");
  if (rank < 0 || rank >= world_->size()) {
    throw ValueError(fmt::format("FakeCommunicator: rank {} out of range for {} ranks", rank, world_->size()));
  }
  stream_ = std::thread([this] { loop(); });
}

FakeCommunicator::~FakeCommunicator() { stopStream(false); }

int FakeCommunicator::size() const { return world_->size(); }

std::string FakeCommunicator::describe() const {
  return fmt::format("fake communicator of rank {} of {}", rank_, world_->size());
}

CommCompletionPtr FakeCommunicator::enqueue(std::span<const CommOp> ops, void* /*stream*/) {
  auto task = std::make_shared<Task>();
  task->ops.assign(ops.begin(), ops.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw DistError(fmt::format("{}: enqueue after abort", describe()));
    task->index = ++enqueued_;
    queue_.push_back(task);
  }
  cv_.notify_one();
  return task;
}

std::string FakeCommunicator::asyncError() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool FakeCommunicator::aborted() const { return abortedFlag_.load(std::memory_order_acquire); }

void FakeCommunicator::abort() { stopStream(true); }

void FakeCommunicator::stopStream(bool runHook) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
  }
  if (runHook && opts_.onAbort) opts_.onAbort(rank_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abortedFlag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(world_->mu_);  // no waiter between its check and its wait
  }
  world_->cv_.notify_all();
  // Once abort returns, the stream touches no buffer again.
  if (stream_.joinable() && stream_.get_id() != std::this_thread::get_id()) stream_.join();
}

void FakeCommunicator::setError(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = e;
}

void FakeCommunicator::loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return aborted_ || !queue_.empty(); });
      if (aborted_) return;
      task = queue_.front();
      queue_.erase(queue_.begin());
    }
    if (!runTask(*task)) return;
  }
}

bool FakeCommunicator::runTask(Task& task) {
  for (const FakeFault& f : opts_.faults) {
    if (f.op != task.index || !f.ranks.count(rank_)) continue;
    std::unique_lock<std::mutex> lock(mu_);
    switch (f.kind) {
      case FakeFault::Kind::Hang: cv_.wait(lock, [&] { return aborted_; }); return false;
      case FakeFault::Kind::Fail:
        if (error_.empty()) error_ = fmt::format("injected failure at op {}", task.index);
        return false;
      case FakeFault::Kind::Straggle:
        if (cv_.wait_for(lock, f.delay, [&] { return aborted_; })) return false;
        break;
    }
  }
  task.hasStarted.store(true, std::memory_order_release);
  for (const CommOp& op : task.ops) {  // sends first: buffered, so a group cannot deadlock on itself
    if (op.kind != CommOpKind::Send) continue;
    const size_t bytes = op.count * elementSize(op.dtype);
    std::vector<uint8_t> msg(bytes);
    if (bytes) std::memcpy(msg.data(), op.send, bytes);
    {
      std::lock_guard<std::mutex> lock(world_->mu_);
      world_->mail_[{rank_, op.peer}].push_back(std::move(msg));
    }
    world_->cv_.notify_all();
  }
  for (const CommOp& op : task.ops) {
    if (op.kind == CommOpKind::Send) continue;
    if (!(op.kind == CommOpKind::Recv ? receive(op) : collective(op))) return false;
  }
  task.isDone.store(true, std::memory_order_release);
  return true;
}

bool FakeCommunicator::receive(const CommOp& op) {
  std::vector<uint8_t> msg;
  {
    std::unique_lock<std::mutex> lock(world_->mu_);
    auto& box = world_->mail_[{op.peer, rank_}];
    world_->cv_.wait(lock, [&] { return aborted() || !box.empty(); });
    if (aborted()) return false;
    msg = std::move(box.front());
    box.erase(box.begin());
  }
  const size_t bytes = op.count * elementSize(op.dtype);
  if (msg.size() != bytes) {
    setError(fmt::format("recv of {} bytes from rank {} got a message of {} bytes", bytes, op.peer, msg.size()));
    return false;
  }
  if (bytes) std::memcpy(op.recv, msg.data(), bytes);
  return true;
}

bool FakeCommunicator::collective(const CommOp& op) {
  const int n = world_->size();
  const size_t es = elementSize(op.dtype);
  const uint64_t index = ++collectives_;
  size_t inBytes = op.count * es;
  if (op.kind == CommOpKind::ReduceScatter) inBytes *= static_cast<size_t>(n);
  if (op.kind == CommOpKind::Broadcast && op.peer != rank_) inBytes = 0;
  std::vector<uint8_t> mine(inBytes);
  if (inBytes) std::memcpy(mine.data(), op.send, inBytes);

  std::unique_lock<std::mutex> lock(world_->mu_);
  FakeCommWorld::Slot& slot = world_->slots_[index];  // std::map: the reference stays valid
  if (slot.data.empty()) {
    slot.data.resize(static_cast<size_t>(n));
    slot.op = op;
    slot.firstRank = rank_;
  } else {
    const CommOp& a = slot.op;
    const bool rooted = op.kind == CommOpKind::Broadcast || op.kind == CommOpKind::Reduce;
    if (a.kind != op.kind || a.count != op.count || a.dtype != op.dtype || (rooted && a.peer != op.peer) ||
        (op.kind != CommOpKind::Broadcast && op.kind != CommOpKind::Allgather && a.op != op.op)) {
      lock.unlock();
      setError(fmt::format("collective mismatch at collective {}: rank {} called {} of {} {} (root {}), rank {} "
                           "called {} of {} {} (root {})",
                           index, slot.firstRank, commOpKindName(a.kind), a.count, dtypeName(a.dtype), a.peer, rank_,
                           commOpKindName(op.kind), op.count, dtypeName(op.dtype), op.peer));
      return false;
    }
  }
  slot.data[static_cast<size_t>(rank_)] = std::move(mine);
  ++slot.arrived;
  world_->cv_.notify_all();
  world_->cv_.wait(lock, [&] { return aborted() || slot.arrived == n; });
  if (aborted()) return false;
  lock.unlock();

  // Every rank arrived: the deposits stay unchanged until every rank has consumed them.
  std::vector<const void*> srcs(static_cast<size_t>(n));
  const size_t outBytes = op.count * es;
  switch (op.kind) {
    case CommOpKind::Allreduce:
    case CommOpKind::Reduce:
      if (op.kind == CommOpKind::Allreduce || op.peer == rank_) {
        for (int r = 0; r < n; ++r) srcs[r] = slot.data[r].data();
        void* outs[1] = {op.recv};
        detail::reduceSourcesInto(op.dtype, outs, 1, srcs.data(), n, op.count, op.op, n);
      }
      break;
    case CommOpKind::Broadcast:
      if (outBytes) std::memcpy(op.recv, slot.data[op.peer].data(), outBytes);
      break;
    case CommOpKind::Allgather:
      for (int r = 0; r < n; ++r) {
        if (outBytes) std::memcpy(static_cast<uint8_t*>(op.recv) + r * outBytes, slot.data[r].data(), outBytes);
      }
      break;
    case CommOpKind::ReduceScatter: {
      for (int r = 0; r < n; ++r) srcs[r] = slot.data[r].data() + rank_ * outBytes;
      void* outs[1] = {op.recv};
      detail::reduceSourcesInto(op.dtype, outs, 1, srcs.data(), n, op.count, op.op, n);
      break;
    }
    case CommOpKind::Send:
    case CommOpKind::Recv: break;
  }

  lock.lock();
  if (++slot.consumed == n) world_->slots_.erase(index);
  return true;
}

}  // namespace cohort::dist
