/*
 * ShmBackend: the collectives for ranks on one host, over POSIX shared memory, registered as
 * "shm". It works for ranks that are separate processes and for ranks that are threads of one
 * process alike.
 *
 * Segments. Each rank owns one segment, "/cohort_<token>_<group>_<rank>" (the token is drawn by
 * rank 0 and shared through the group's store, so names are unique to the job and the group): a
 * header page, then two slots of COHORT_SHM_SLOT_BYTES (default 4 MiB) that only its owner
 * writes. Ranks announce their segment names through the store, map every peer's segment, meet
 * once over shared memory, and then each unlinks its own name at once: from then on nothing of
 * the group is left in /dev/shm whatever happens, and the memory goes away with the last mapping.
 * If setup fails half way, the ranks unlink every name they know (their own and their peers').
 *
 * Cleanup. A name is only in /dev/shm between its creation and the meeting that follows, but a
 * rank may wait there long (for a late peer, up to the group's timeout), and a job stopped then
 * (scancel, a launcher's SIGTERM, Ctrl-C) would leave it behind: segments of 8 MiB in a /dev/shm
 * that containers often cap at 64 MiB. So while a rank holds a name it has not unlinked (its
 * segment in setup, its buffer in allocateCommBuffer), a handler for SIGTERM, SIGINT and SIGHUP
 * is in place that unlinks those names and then dies of the signal as if it had not been there.
 * It is installed only for signals whose disposition is the default (a program's own handler or
 * SIG_IGN is left alone) and removed again when no name is pending. A process killed without a
 * handler (SIGKILL, a crash) cannot clean up: the next group made in the same pid namespace
 * removes every cohort segment whose header names an owner that no longer runs, with a warning.
 *
 * Rounds. Every op is a sequence of rounds that every rank runs in the same order: write into
 * this rank's slot for the round (slot = round % 2), publish the round number in the header's
 * counter, wait until every peer's counter reached it, then read the peers' slots of that round.
 * Since a rank only publishes round k+1 after it finished reading round k-1's slots, and waits
 * for everyone's round k before writing round k+1, two slots are enough and no other handshake
 * is needed (the slot of round k+1 may even be written while round k's are read, which the
 * allreduce uses to pipeline). Large payloads stream through the slots chunk by chunk.
 *
 * Allreduce. Up to COHORT_SHM_SMALL_BYTES (default 32 KiB): one round (every rank copies its
 * tensor in, then every rank reduces all slots in rank order, so all get the same bits). Above:
 * reduce-scatter + allgather, pipelined over chunks of n/(n+1) of a slot, one round per chunk:
 * each rank copies the others' slices of chunk k into its slot; after the round it copies the
 * others' reduced slices of chunk k-1 out of their slots, then reduces its own 1/n slice of
 * chunk k reading the peers' slots directly (its own part from its tensor) and writes the result
 * to its tensor and behind the chunk in its next slot. One last round delivers the last slices.
 * Reductions run over blocks that stay in L1, in the accumulation type (float32 for
 * float16/bfloat16, rounded once), in plain loops over __restrict pointers that the compiler
 * vectorizes.
 *
 * Other ops. broadcast, reduce, allgather and gather: one round per slot-sized chunk (the root or
 * every rank writes, the others read; reduce reduces on the root in rank order). reduce_scatter,
 * scatter and alltoall split the slot into one region per destination rank. Uneven alltoall and
 * alltoall of lists first exchange every rank's send and receive sizes (one round), so every rank
 * checks every pair alike (a mismatch is a DistError on all ranks) and agrees on the rounds.
 * Coalesced forms pack their tensors into one buffer.
 *
 * Waiting. A rank spins on a peer's counter for COHORT_SHM_SPIN_US (default 20 µs, with pause),
 * then sleeps on a futex on that counter (the signaller wakes it only when a waiter flag in the
 * header says someone sleeps), so on a 2-core machine a waiting rank gives its core away.
 * Sleeps last at most 100 ms; past the first 100 ms of waiting the waiter checks that the peer's
 * process (pid in its header, when it is in this pid namespace) is alive, and a peer that
 * aborted or closed its backend sets a state flag (and its reason) that wakes its waiters.
 * Hence: a dead peer → PeerError naming it, within about 100 ms (plus the group's diagnosis,
 * which waits up to 500 ms for the peers' reports); a stalled peer → TimeoutError at the op's deadline; both name the
 * op. After any failure the backend is aborted (later ops fail at once with the first error) and tells its peers so.
 *
 * Threads. By default collectives run on the caller's thread and the returned Work is already
 * complete (as the mpi backend's default): a 4 KiB allreduce takes a few µs here, and handing
 * each op to a worker thread would cost two context switches (tens of µs on a 2-core host).
 * Deadlines are still honoured, since every wait is bounded by the op's deadline. The price is
 * that communication does not overlap the caller's computation; COHORT_COLLECTIVE_THREAD=worker runs
 * the ops on one worker thread per group instead, in issue order (as the gloo backend), for
 * hosts with a core to spare. Ops of one group are serialized by a mutex; different groups have
 * different segments and may run concurrently.
 *
 * Registered buffers. allocateCommBuffer (caller mode) makes a tensor in a shared object of its
 * own per rank ("<segment>_b<id>", ids counted alike on every rank since the call is
 * collective): each rank creates and reserves its object, the ranks meet, map each other's,
 * meet again and unlink their names, checking in each meeting (through a descriptor every rank
 * writes into its header for the round) that all asked for the same id and size and succeeded.
 * A rank that cannot make or map its buffer (a full /dev/shm: containers often give 64 MiB; or a
 * buffer above COHORT_SHM_MAX_BUFFER_BYTES) makes every rank fall back to plain memory together,
 * with a warning; ranks that asked for different sizes are a DistError on every rank.
 * An allreduce above the small size states in the same way whether its tensor lies in a
 * registered buffer (id, offset, bytes). When every rank's does, alike, no slot is used: each
 * rank reduces its 1/n slice reading every rank's buffer and writes the result into every
 * rank's buffer, and one more meeting ends the op (nobody touches its buffer before the others
 * are done with it): two rounds, half the memory traffic of the slot algorithm and no copy in or
 * out. When only some ranks' are, every rank runs the slot algorithm from a fresh round. The
 * mappings go when the tensor's storage does (the peers' with it), even after the backend.
 *
 * Point to point. Tagged messages that may be received out of order do not fit the rounds, so
 * send/recv have rings of their own at the end of each segment, one per destination
 * (COHORT_SHM_P2P_BYTES, default 1 MiB): the sender copies a message that fits into the ring on
 * its own thread and its Work is complete at once; a per-group progress thread on the receiving
 * side takes it out into the posted recv's tensor (or keeps it until that recv is posted), and
 * streams what did not fit (shm_p2p.h). Nothing of the sender is needed after the copy, so a
 * pipeline rank's activations move while it computes.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/util/error.h>
#include <cohort/distributed/backend.h>

namespace cohort::dist {
class OpQueue;  // detail/op_queue.h
}  // namespace cohort::dist

namespace cohort::dist::shm_backend {

class ShmP2P;  // shm_p2p.h

// The header page of every rank's segment. The counter and the flags live in separate cache
// lines so the owner's writes do not bounce the line the peers poll.
struct alignas(64) ShmHeader {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  uint64_t slotBytes;
  uint64_t pidNamespace;                      // inode of /proc/self/ns/pid: pids are only comparable within one
  alignas(64) std::atomic<uint64_t> counter;  // last round this rank published (futex on the low half)
  alignas(64) std::atomic<uint32_t> waiters;  // peers sleeping on `counter`
  alignas(64) std::atomic<uint32_t> state;    // kLive, kAborted, kClosed
  static constexpr uint32_t kLive = 0, kAborted = 1, kClosed = 2;
  char reason[448];  // why it aborted (written before `state`)
  // What this rank does in a round, for the peers to check (allreduce, allocateCommBuffer):
  // kind, buffer id, offset, bytes; one per slot parity, written before the round is published.
  alignas(64) uint64_t desc[2][4];
  // Point to point (shm_p2p.h): rung by a peer that published into a ring to this rank or freed
  // space in one of this rank's rings (futex on the low half); whether the progress thread sleeps.
  alignas(64) std::atomic<uint64_t> p2pBell;
  alignas(64) std::atomic<uint32_t> p2pSleeping;
  uint64_t p2pRingBytes;
};

// Sizes, spin time and thread mode; fromEnv() reads COHORT_SHM_SLOT_BYTES, COHORT_SHM_SMALL_BYTES,
// COHORT_SHM_SPIN_US, COHORT_COLLECTIVE_THREAD, COHORT_SHM_MAX_BUFFER_BYTES and COHORT_SHM_P2P_BYTES (every
// rank of a group must use the same slot and ring sizes).
struct ShmConfig {
  size_t slotBytes = 4 << 20;
  size_t smallBytes = 32 << 10;
  std::chrono::microseconds spin{20};
  bool worker = false;        // run ops on a worker thread (COHORT_COLLECTIVE_THREAD=worker) instead of the caller's
  size_t maxBufferBytes = 0;  // allocateCommBuffer: larger buffers are plain memory (0: no cap)
  size_t p2pBytes = 1 << 20;  // each send/recv ring (one per destination)
  static ShmConfig fromEnv();
};

class ShmBackend : public Backend {
 public:
  ShmBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts,
             const ShmConfig& config = ShmConfig::fromEnv());
  ~ShmBackend() override;

  bool supports(OpType op) const override;

  void allreduce(Tensor& tensor, const AllreduceOptions& opts, const WorkPtr& work) override;
  void allreduceCoalesced(std::vector<Tensor>& tensors, const AllreduceOptions& opts, const WorkPtr& work) override;
  void broadcast(Tensor& tensor, const BroadcastOptions& opts, const WorkPtr& work) override;
  void reduce(Tensor& tensor, const ReduceOptions& opts, const WorkPtr& work) override;
  void allgather(std::vector<Tensor>& outputs, const Tensor& input, const AllgatherOptions& opts,
                 const WorkPtr& work) override;
  void allgatherIntoTensor(Tensor& output, const Tensor& input, const AllgatherOptions& opts,
                           const WorkPtr& work) override;
  void allgatherCoalesced(std::vector<std::vector<Tensor>>& outputs, const std::vector<Tensor>& inputs,
                          const AllgatherOptions& opts, const WorkPtr& work) override;
  void reduceScatter(Tensor& output, std::vector<Tensor>& inputs, const ReduceScatterOptions& opts,
                     const WorkPtr& work) override;
  void reduceScatterTensor(Tensor& output, const Tensor& input, const ReduceScatterOptions& opts,
                           const WorkPtr& work) override;
  void alltoall(Tensor& output, const Tensor& input, const AlltoallOptions& opts, const WorkPtr& work) override;
  void alltoallList(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const AlltoallOptions& opts,
                    const WorkPtr& work) override;
  void gather(std::vector<Tensor>& outputs, const Tensor& input, const GatherOptions& opts,
              const WorkPtr& work) override;
  void scatter(Tensor& output, const std::vector<Tensor>& inputs, const ScatterOptions& opts,
               const WorkPtr& work) override;
  void barrier(const BarrierOptions& opts, const WorkPtr& work) override;
  void send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) override;
  void recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) override;

  void abort(const std::string& reason) override;

  // A tensor in shared memory every rank maps (see "Registered buffers"); in worker mode plain
  // memory, since the call must not interleave with queued ops.
  Tensor allocateCommBuffer(const Shape& sizes, DType dtype, Millis timeout) override;
  // Allreduces that ran directly on registered buffers (tests and benchmarks check the path).
  uint64_t registeredAllreduces() const { return registeredAllreduces_.load(); }
  // Messages received before their recv was posted, kept in a buffer until it was (tests check
  // that a recv posted by the previous message's callback is not one).
  uint64_t bufferedMessages() const;

  // The segment names of this group (for tests: none of them may remain in /dev/shm).
  const std::vector<std::string>& segmentNames() const { return names_; }

 private:
  // Raised inside an op by a failed wait; run() maps it onto the Work's typed error.
  struct Failure {
    bool timeout;
    std::string detail;
  };
  using Deadline = std::chrono::steady_clock::time_point;

  // Runs one op, on the caller's thread or queued for the worker (see the header comment).
  template <typename F>
  void run(const WorkPtr& work, F&& body);
  // Fails the Work at once when the backend is aborted, else runs `body` and completes the Work
  // with its outputs or its typed error.
  void execute(const WorkPtr& work, const std::function<std::vector<Tensor>(Deadline)>& body);

  // ---- rounds (see the header comment) ----
  uint8_t* slot(int rank, uint64_t round) const;
  size_t p2pOffset() const;  // of the send/recv region in a segment: after the header and the slots
  uint8_t* writeSlot() const { return slot(rank(), round_ + 1); }   // this rank's slot for the next round
  uint8_t* readSlot(int peer) const { return slot(peer, round_); }  // a peer's slot of the current round
  // Publishes the next round and waits for every peer to reach it.
  void sync(Deadline deadline, const char* what);
  void waitPeer(int peer, uint64_t target, Deadline deadline, const char* what);
  void signal();

  // ---- byte-level collectives over the rounds (shm_ops.cc) ----
  void allreduceBytes(void* data, size_t count, DType dtype, ReduceOp op, Deadline dl);
  void allgatherBytes(const void* in, size_t bytes, const std::vector<uint8_t*>& outs, Deadline dl);
  void reduceScatterBytes(const std::vector<const uint8_t*>& pieces, uint8_t* out, size_t count, DType dtype,
                          ReduceOp op, Deadline dl);
  void alltoallBytes(const std::vector<const uint8_t*>& send, const std::vector<size_t>& sendBytes,
                     const std::vector<uint8_t*>& recv, const std::vector<size_t>& recvBytes, bool sizesKnownEqual,
                     Deadline dl);

  // ---- descriptors and registered buffers ----
  struct Desc {
    static constexpr uint64_t kPlain = 1, kRegistered = 2, kAlloc = 3;
    uint64_t kind = 0, id = 0, offset = 0, bytes = 0;  // kAlloc: offset = 1 when this rank succeeded
    bool operator==(const Desc&) const = default;
  };
  void publishDesc(const Desc& d);  // for the next round
  Desc peerDesc(int peer) const;    // of the current round (after sync)
  // The registered buffer holding [data, data + bytes): its id, the offset and every rank's base.
  bool findRegistered(const void* data, size_t bytes, Desc& desc, std::vector<uint8_t*>& bases) const;
  // Reduces this rank's slice of a registered buffer into every rank's buffer (after the
  // descriptor round), then meets the peers once more.
  void allreduceRegistered(const std::vector<uint8_t*>& bases, size_t offset, size_t count, DType dtype, ReduceOp op,
                           Deadline dl);
  // The slot algorithm; with checkPeers, returns false (and leaves the rest undone) when a peer's
  // tensor was registered, so that every rank starts over.
  bool allreduceSlots(uint8_t* d, size_t count, DType dtype, ReduceOp op, Deadline dl, bool checkPeers);

  struct CommBuffer {
    uint64_t id = 0;
    size_t bytes = 0;
    size_t mapBytes = 0;
    std::vector<uint8_t*> bases;  // every rank's mapping; this rank's is the tensor's memory
  };
  struct CommBuffers {
    mutable std::mutex mu;
    std::vector<CommBuffer> list;
  };

  void breakWith(const std::string& message);
  PeerError brokenError() const;  // what ops get once the backend is aborted
  void unlinkAll();

  std::string group_;
  size_t slotBytes_ = 0;
  size_t mapBytes_ = 0;
  size_t smallBytes_ = 0;
  size_t maxBufferBytes_ = 0;
  std::chrono::nanoseconds spin_{0};
  std::vector<std::string> names_;
  std::vector<uint8_t*> bases_;
  std::vector<int> pids_;  // 0 where liveness cannot be checked (this process, another pid namespace)
  uint64_t round_ = 0;

  std::mutex opMu_;
  std::atomic<bool> broken_{false};
  mutable std::mutex errMu_;
  std::string brokenMessage_;

  size_t p2pBytes_ = 0;          // each ring's data bytes
  std::unique_ptr<ShmP2P> p2p_;  // send/recv (groups of two ranks or more)

  std::shared_ptr<CommBuffers> buffers_ = std::make_shared<CommBuffers>();  // shared with their deleters
  uint64_t nextBufferId_ = 0;
  std::atomic<uint64_t> registeredAllreduces_{0};

  std::unique_ptr<OpQueue> ops_;  // worker mode only
};

}  // namespace cohort::dist::shm_backend
