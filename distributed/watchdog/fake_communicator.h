/*
 * FakeCommunicator: a Communicator (communicator.h) over plain host memory, joining ranks that are
 * threads of one process, built in every configuration. It exists to test what sits above a
 * communicator — the watchdog, the communicator backend, ProcessGroup's failure paths — without
 * a GPU, including the failures a real one only shows at scale: a rank that hangs inside op k, a
 * communicator that fails asynchronously at op k, a rank that straggles.
 *
 * Model. The ranks share a FakeCommWorld. Each rank has one "stream": a thread that runs the ops
 * enqueued on it in order (the stream argument of enqueue is ignored), so enqueue returns at once
 * and an op completes later, as on a GPU. A collective is a rendezvous: each rank deposits a copy
 * of its input under the collective's index (the n-th collective of every rank meets the n-th of
 * the others), waits for every rank, and computes its own result from the deposits — the
 * CPU backends' reduction kernels, so results are theirs. A send deposits a copy in the (src, dst)
 * mailbox at once (buffered, like NCCL's small messages, so a group of sends and receives
 * cannot deadlock against itself); a receive waits for the next message of its pair. In a group,
 * the sends go first, then the other ops in order. Ranks whose n-th collectives differ in kind,
 * count, dtype or root get an asynchronous error naming both ("collective mismatch"), as NCCL
 * would hang or corrupt.
 *
 * Faults, counted in enqueue calls (a group is one; the first is op 1), on chosen ranks:
 *  - Hang: the stream stops before op k: the op never starts (nor do later ones) until abort().
 *    Peers that reach op k wait for this rank forever (until their watchdog gives up).
 *  - Fail: at op k, the communicator reports an asynchronous error ("injected failure at op k")
 *    and its stream stops, as an NCCL communicator does after ncclCommGetAsyncError reports one.
 *  - Straggle: the stream waits `delay` before starting op k, then goes on normally.
 *
 * abort() stops the rank's stream (joined before abort returns, so no buffer is touched after it)
 * and wakes its waits; peers stay blocked until their own abort, as with NCCL.
 */
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <cohort/distributed/watchdog/communicator.h>

namespace cohort::dist {

struct FakeFault {
  enum class Kind { Hang, Fail, Straggle };
  Kind kind = Kind::Hang;
  uint64_t op = 1;        // the enqueue call it hits, from 1
  std::set<int> ranks{};  // the ranks it hits
  Millis delay{0};        // Straggle
};

struct FakeCommOptions {
  std::vector<FakeFault> faults{};
  // Called by abort() on the aborting rank's thread, before it stops anything (for tests that
  // check what happened before the abort, e.g. that the flight recorders were dumped).
  std::function<void(int rank)> onAbort{};
};

// The ranks' shared state (internal to the fake; made by FakeCommWorld::create).
class FakeCommWorld;

class FakeCommunicator : public Communicator {
 public:
  // Rank `rank` of `world` (which has the size).
  FakeCommunicator(std::shared_ptr<FakeCommWorld> world, int rank, FakeCommOptions opts = {});
  ~FakeCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  std::string describe() const override;
  CommCompletionPtr enqueue(std::span<const CommOp> ops, void* stream) override;
  using Communicator::enqueue;
  std::string asyncError() override;
  void abort() override;
  bool aborted() const override;

 private:
  struct Task;
  void loop();
  bool runTask(Task& task);  // false: the stream stops (aborted or failed)
  bool collective(const CommOp& op);
  bool receive(const CommOp& op);
  void setError(const std::string& e);
  void stopStream(bool runHook);

  std::shared_ptr<FakeCommWorld> world_;
  const int rank_;
  FakeCommOptions opts_;
  uint64_t enqueued_ = 0;     // enqueue calls (user thread)
  uint64_t collectives_ = 0;  // collectives run (stream thread)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Task>> queue_;
  bool aborted_ = false;
  std::atomic<bool> abortedFlag_{false};  // aborted_, read by waits on the world's lock
  std::string error_;
  std::thread stream_;
};

class FakeCommWorld : public std::enable_shared_from_this<FakeCommWorld> {
 public:
  static std::shared_ptr<FakeCommWorld> create(int size);
  int size() const { return size_; }

  // The world `id` of `size` ranks, made by whichever rank asks first (ranks of one group find it
  // by an id they agreed on through the store; see comm_backend.cc). Held weakly: it goes with
  // its last communicator.
  static std::shared_ptr<FakeCommWorld> shared(const std::string& id, int size);

 private:
  friend class FakeCommunicator;
  explicit FakeCommWorld(int size) : size_(size) {}
  struct Slot {
    CommOp op{};  // the first arrival's, to check the others against
    int firstRank = -1;
    int arrived = 0;
    int consumed = 0;
    std::vector<std::vector<uint8_t>> data;  // per rank: its input
  };
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Slot> slots_;
  std::map<std::pair<int, int>, std::vector<std::vector<uint8_t>>> mail_;  // (src, dst) -> messages, oldest first
};

}  // namespace cohort::dist
