/*
 * Internal to the shm backend: send and recv over shared memory (shm_backend.h, "Point to
 * point").
 *
 * Mailboxes. Every rank's segment ends with one ring per destination rank (COHORT_SHM_P2P_BYTES
 * each, default 1 MiB; /dev/shm only counts the pages a ring has used). Only the sender writes
 * its ring's data and head, only the receiver its tail: a single-producer, single-consumer
 * queue of records, each a 32-byte header (tag, the message's size, this chunk's offset and
 * size) and the chunk, 64-byte aligned, the chunk wrapping around the ring's end.
 *
 * Sending. send() copies the whole message into the ring on the caller's thread when it fits and
 * nothing to that rank is queued before it; its Work is then complete when send() returns, and
 * the tensor may be reused at once. This is the common case (a pipeline's activations), and it
 * needs nothing of the sender afterwards: the receiver takes the data out while the sender
 * computes, which matters when each rank has one core. A message that does not fit goes in
 * chunks, written by this rank's progress thread as the receiver frees space.
 *
 * Receiving. One progress thread per backend (started with the first send or recv) sleeps on a
 * futex word in this rank's header, the bell, which senders ring when they publish and receivers
 * when they free space. It takes each record out of the ring: into the tensor of the oldest
 * posted recv for its (source, tag), or, when none is posted yet, into a buffer of its own (an
 * unexpected message, handed to the next recv for that source and tag). Messages of one (source,
 * tag) are received in the order they were sent. A recv whose tensor does not have the message's
 * size fails with a DistError naming both sizes (the message is dropped).
 *
 * Failures. Every wait is bounded by its Work's deadline: a send or recv that does not complete by
 * then fails with a TimeoutError. Past 100 ms of waiting on a peer, the thread checks every 100 ms
 * whether it aborted, closed its group or died (its pid), and fails the op with a PeerError
 * naming it. Either breaks the backend (its message then fails every pending and later op), as a
 * late message could otherwise be taken by a later recv of the same tag.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/work.h>

namespace cohort::dist::shm_backend {

struct ShmHeader;

// The control block of one ring, at the start of the sender's p2p region (one per destination).
struct alignas(64) P2PRingControl {
  alignas(64) std::atomic<uint64_t> head;           // bytes the sender published (written by the sender)
  alignas(64) std::atomic<uint64_t> tail;           // bytes the receiver took out (written by the receiver)
  alignas(64) std::atomic<uint32_t> senderWaiting;  // the sender waits for space: ring its bell
};

class ShmP2P {
 public:
  struct Layout {
    int rank = 0;
    int size = 1;
    std::string group;
    std::vector<ShmHeader*> headers;  // every rank's segment header
    std::vector<uint8_t*> regions;    // every rank's p2p region (regionBytes(size, ringBytes) each)
    std::vector<int> pids;            // 0 where liveness cannot be checked
    size_t ringBytes = 0;             // data bytes of each ring (a multiple of 64)
  };
  // The bytes of a rank's p2p region: the control blocks, then `size` rings.
  static size_t regionBytes(int size, size_t ringBytes);
  // Prepares this rank's region (zeroes its control blocks) before the peers map it.
  static void initRegion(uint8_t* region, int size);

  // `breakGroup(message)` is the backend's breakWith: it must call abort() (below).
  ShmP2P(Work::CompletionKey key, Layout layout, std::function<void(const std::string&)> breakGroup);
  ~ShmP2P();  // stops the thread; pending ops fail ("the process group was destroyed ...")
  ShmP2P(const ShmP2P&) = delete;
  ShmP2P& operator=(const ShmP2P&) = delete;

  void send(const Tensor& tensor, int dst, int64_t tag, const WorkPtr& work);
  void recv(Tensor& tensor, int src, int64_t tag, const WorkPtr& work);

  // The backend broke: every pending op fails with `error`, and so does every later one.
  void abort(std::exception_ptr error);

  // Messages that arrived before their recv and went through a buffer of their own.
  uint64_t bufferedMessages() const { return buffered_.load(std::memory_order_relaxed); }

 private:
  struct Outgoing {
    WorkPtr work;
    Tensor tensor;  // keeps the data alive until it is all in the ring
    uint64_t tag = 0;
    uint64_t sent = 0;
    bool started = false;  // the first record is written (an empty message is one record)
  };
  struct PendingRecv {
    WorkPtr work;
    Tensor tensor;
  };
  struct Unexpected {
    std::vector<uint8_t> data;
    uint64_t received = 0;
    bool complete = false;
  };
  // The message being taken out of one source's ring (its chunks are contiguous in the ring).
  struct Incoming {
    bool active = false;
    uint64_t tag = 0, total = 0, received = 0;
    uint8_t* target = nullptr;        // null: dropped (a size mismatch)
    std::optional<PendingRecv> recv;  // delivered straight into this recv's tensor
    Unexpected* buffer = nullptr;     // or into an unexpected message
  };
  using Key = std::pair<int, uint64_t>;  // (source, tag)
  // A Work to complete once mu_ is released: failed with `error`, else finished with `tensor`.
  struct Done {
    WorkPtr work;
    std::exception_ptr error;
    Tensor tensor;
  };

  P2PRingControl* control(int sender, int receiver) const;
  uint8_t* ringData(int sender, int receiver) const;
  void ringBell(int rank) const;
  void startThread();
  void loop();
  // With mu_ held: writes what fits of `o` into the ring to `dst`; true when all of it is in.
  bool push(int dst, Outgoing& o);
  // With mu_ held: takes records out of `src`'s ring, up to the end of the first message that
  // completes a recv (completions go to `done`); true when it stopped there with more to take.
  // Completing that recv runs its callbacks, which may post the recv the next message is for
  // (the pipeline's transport posts a tensor's data recv when its header arrives): that message
  // then goes straight into its tensor instead of through a buffer of its own.
  bool drain(int src, std::vector<Done>& done);
  // With mu_ held: the oldest unexpected message of `key` to the oldest recv, while both exist.
  void matchUnexpected(const Key& key, std::vector<Done>& done);
  // With mu_ held: the first op past its deadline, or waiting on a peer that is gone (checked
  // every 100 ms), taken out of the pending ops; false when there is none.
  bool findFailure(std::chrono::steady_clock::time_point now, Done& culprit, std::string& why);
  std::string peerGone(int peer) const;  // "" while `peer` is live, else why not
  bool waitsOn(int peer) const;          // with mu_ held: an op of this rank waits on `peer`
  static void complete(Work::CompletionKey key, std::vector<Done>& done);

  const Work::CompletionKey key_;
  const Layout layout_;
  const std::function<void(const std::string&)> breakGroup_;

  std::mutex mu_;                               // everything below
  std::exception_ptr error_;                    // set once the backend broke
  std::vector<std::deque<Outgoing>> outgoing_;  // per destination, in send order
  std::map<Key, std::deque<PendingRecv>> recvs_;
  std::map<Key, std::deque<Unexpected>> unexpected_;
  std::vector<Incoming> incoming_;  // per source
  std::chrono::steady_clock::time_point lastLiveness_{};
  bool stop_ = false;
  std::atomic<uint64_t> buffered_{0};
  std::once_flag threadOnce_;
  std::thread thread_;
};

}  // namespace cohort::dist::shm_backend
