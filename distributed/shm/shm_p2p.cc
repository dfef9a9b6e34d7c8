// ShmP2P: send and recv over shared-memory rings (see shm_p2p.h).
#include <cohort/distributed/shm/shm_p2p.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/shm/detail/futex.h>
#include <cohort/distributed/shm/shm_backend.h>

namespace cohort::dist::shm_backend {

namespace {

// The header of every record in a ring.
struct Record {
  uint64_t tag;
  uint64_t total;   // the message's bytes
  uint64_t offset;  // of this chunk in the message
  uint64_t bytes;   // of this chunk
};
constexpr uint64_t kRecordHeader = 32;
static_assert(sizeof(Record) == kRecordHeader);

constexpr auto kLivenessEvery = std::chrono::milliseconds(100);
constexpr auto kPendingSlice = std::chrono::milliseconds(100);
constexpr auto kIdleSlice = std::chrono::seconds(1);

constexpr uint64_t roundUp64(uint64_t n) { return (n + 63) & ~uint64_t{63}; }
size_t controlBytes(int size) { return (size * sizeof(P2PRingControl) + 4095) & ~size_t{4095}; }

}  // namespace

size_t ShmP2P::regionBytes(int size, size_t ringBytes) { return controlBytes(size) + size * ringBytes; }

void ShmP2P::initRegion(uint8_t* region, int size) {
  for (int r = 0; r < size; ++r) {
    auto* c = new (region + r * sizeof(P2PRingControl)) P2PRingControl{};
    c->head.store(0);
    c->tail.store(0);
    c->senderWaiting.store(0);
  }
}

ShmP2P::ShmP2P(Work::CompletionKey key, Layout layout, std::function<void(const std::string&)> breakGroup)
    : key_(key), layout_(std::move(layout)), breakGroup_(std::move(breakGroup)) {
  outgoing_.resize(layout_.size);
  incoming_.resize(layout_.size);
}

ShmP2P::~ShmP2P() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  ringBell(layout_.rank);
  if (thread_.joinable()) thread_.join();
  abort(std::make_exception_ptr(
      DistError(fmt::format("shm backend of group '{}' was destroyed before the op completed", layout_.group))));
}

P2PRingControl* ShmP2P::control(int sender, int receiver) const {
  return reinterpret_cast<P2PRingControl*>(layout_.regions[sender]) + receiver;
}

uint8_t* ShmP2P::ringData(int sender, int receiver) const {
  return layout_.regions[sender] + controlBytes(layout_.size) + receiver * layout_.ringBytes;
}

void ShmP2P::ringBell(int rank) const {
  ShmHeader* h = layout_.headers[rank];
  h->p2pBell.fetch_add(1, std::memory_order_seq_cst);
  if (h->p2pSleeping.load(std::memory_order_seq_cst) != 0) os::futexWakeAll(&h->p2pBell);
}

void ShmP2P::startThread() {
  std::call_once(threadOnce_, [this] { thread_ = std::thread([this] { loop(); }); });
}

void ShmP2P::complete(Work::CompletionKey key, std::vector<Done>& done) {
  for (Done& d : done) {
    if (d.error) d.work->fail(key, d.error);
    else d.work->finish(key, {std::move(d.tensor)});
  }
  done.clear();
}

// ---- sending -----------------------------------------------------------------------------------

bool ShmP2P::push(int dst, Outgoing& o) {
  P2PRingControl* c = control(layout_.rank, dst);
  uint8_t* data = ringData(layout_.rank, dst);
  const uint64_t cap = layout_.ringBytes;
  const uint64_t minChunk = std::min<uint64_t>(64 << 10, cap / 4);
  const uint64_t total = o.tensor.nbytes();
  const auto* src = static_cast<const uint8_t*>(o.tensor.dataPtr());
  uint64_t head = c->head.load(std::memory_order_relaxed);
  bool wrote = false, armed = false;
  while (!(o.started && o.sent == total)) {
    const uint64_t free = cap - (head - c->tail.load(std::memory_order_acquire));
    const uint64_t remaining = total - o.sent;
    const uint64_t chunk = free >= 64 ? std::min(remaining, free - kRecordHeader) : 0;
    // The whole rest, or a chunk worth writing; else wait for the receiver to free more.
    if (free < 64 || (chunk < remaining && chunk < minChunk)) {
      if (armed) break;
      // Ask to be woken when space frees, then look once more (the receiver may have taken
      // records out before it could see the request).
      c->senderWaiting.store(1, std::memory_order_seq_cst);
      armed = true;
      continue;
    }
    const uint64_t pos = head % cap;  // a multiple of 64, so the header never wraps
    const Record rec{o.tag, total, o.sent, chunk};
    std::memcpy(data + pos, &rec, kRecordHeader);
    const uint64_t start = pos + kRecordHeader;
    const uint64_t first = std::min(chunk, cap - start);
    if (first) std::memcpy(data + start, src + o.sent, first);
    if (chunk > first) std::memcpy(data, src + o.sent + first, chunk - first);
    head += roundUp64(kRecordHeader + chunk);
    c->head.store(head, std::memory_order_release);
    o.sent += chunk;
    o.started = true;
    wrote = true;
  }
  if (wrote) ringBell(dst);
  return o.started && o.sent == total;
}

void ShmP2P::send(const Tensor& tensor, int dst, int64_t tag, const WorkPtr& work) {
  startThread();
  std::vector<Done> done;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Outgoing o{work, tensor, static_cast<uint64_t>(tag)};
    if (error_) {
      done.push_back({work, error_, {}});
    } else if (outgoing_[dst].empty() && push(dst, o)) {
      done.push_back({work, nullptr, tensor});
    } else {
      outgoing_[dst].push_back(std::move(o));
      queued = true;
    }
  }
  if (queued) ringBell(layout_.rank);  // the progress thread writes the rest as space frees
  complete(key_, done);
}

// ---- receiving ---------------------------------------------------------------------------------

void ShmP2P::recv(Tensor& tensor, int src, int64_t tag, const WorkPtr& work) {
  startThread();
  std::vector<Done> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) {
      done.push_back({work, error_, {}});
    } else {
      const Key key{src, static_cast<uint64_t>(tag)};
      recvs_[key].push_back({work, tensor});
      matchUnexpected(key, done);
    }
  }
  complete(key_, done);
}

namespace {
std::string sizeMismatch(int src, uint64_t tag, uint64_t message, uint64_t tensor) {
  return fmt::format("shm: the message from rank {} with tag {} has {} bytes, the receiving tensor {}", src, tag,
                     message, tensor);
}
}  // namespace

void ShmP2P::matchUnexpected(const Key& key, std::vector<Done>& done) {
  auto u = unexpected_.find(key);
  auto r = recvs_.find(key);
  while (u != unexpected_.end() && r != recvs_.end() && !u->second.empty() && !r->second.empty() &&
         u->second.front().complete) {
    Unexpected msg = std::move(u->second.front());
    u->second.pop_front();
    PendingRecv rv = std::move(r->second.front());
    r->second.pop_front();
    if (rv.tensor.nbytes() != msg.data.size()) {
      done.push_back(
          {rv.work, rv.work->distError(sizeMismatch(key.first, key.second, msg.data.size(), rv.tensor.nbytes())), {}});
    } else {
      if (!msg.data.empty()) std::memcpy(rv.tensor.dataPtr(), msg.data.data(), msg.data.size());
      done.push_back({rv.work, nullptr, rv.tensor});
    }
  }
  if (u != unexpected_.end() && u->second.empty()) unexpected_.erase(u);
  if (r != recvs_.end() && r->second.empty()) recvs_.erase(r);
}

bool ShmP2P::drain(int src, std::vector<Done>& done) {
  P2PRingControl* c = control(src, layout_.rank);
  const uint8_t* data = ringData(src, layout_.rank);
  const uint64_t cap = layout_.ringBytes;
  uint64_t tail = c->tail.load(std::memory_order_relaxed);
  const uint64_t head = c->head.load(std::memory_order_acquire);
  bool consumed = false;
  while (tail != head) {
    const uint64_t pos = tail % cap;
    Record rec;
    std::memcpy(&rec, data + pos, kRecordHeader);
    Incoming& in = incoming_[src];
    if (!in.active) {
      in = Incoming{};
      in.active = true;
      in.tag = rec.tag;
      in.total = rec.total;
      const Key key{src, rec.tag};
      auto r = recvs_.find(key);
      const bool queuedBefore = unexpected_.count(key) != 0;
      if (!queuedBefore && r != recvs_.end()) {
        PendingRecv rv = std::move(r->second.front());
        r->second.pop_front();
        if (r->second.empty()) recvs_.erase(r);
        if (rv.tensor.nbytes() != rec.total) {
          done.push_back({rv.work, rv.work->distError(sizeMismatch(src, rec.tag, rec.total, rv.tensor.nbytes())), {}});
        } else {
          in.target = static_cast<uint8_t*>(rv.tensor.dataPtr());
          in.recv = std::move(rv);
        }
      } else {
        auto& q = unexpected_[key];
        q.push_back(Unexpected{std::vector<uint8_t>(rec.total)});
        buffered_.fetch_add(1, std::memory_order_relaxed);
        in.buffer = &q.back();
        in.target = in.buffer->data.data();
      }
    }
    if (rec.tag != in.tag || rec.offset != in.received || rec.total != in.total || rec.bytes > in.total - in.received) {
      // Only a corrupted ring (something else wrote to the segment) gets here.
      throw DistError(fmt::format("shm: a malformed record arrived from rank {} (tag {}, offset {}, {} of {} bytes)",
                                  src, rec.tag, rec.offset, rec.bytes, rec.total));
    }
    const uint64_t start = pos + kRecordHeader;
    const uint64_t first = std::min(rec.bytes, cap - start);
    if (in.target) {
      if (first) std::memcpy(in.target + rec.offset, data + start, first);
      if (rec.bytes > first) std::memcpy(in.target + rec.offset + first, data, rec.bytes - first);
    }
    in.received += rec.bytes;
    tail += roundUp64(kRecordHeader + rec.bytes);
    c->tail.store(tail, std::memory_order_release);
    consumed = true;
    if (in.received == in.total) {
      const Key key{src, in.tag};
      const size_t before = done.size();
      if (in.recv) {
        done.push_back({in.recv->work, nullptr, in.recv->tensor});
      } else if (in.buffer) {
        in.buffer->received = in.total;
        in.buffer->complete = true;
      }
      const bool unexpected = in.buffer != nullptr;
      in = Incoming{};
      if (unexpected) matchUnexpected(key, done);
      if (done.size() > before) break;  // let its callbacks run before the next message
    }
  }
  if (consumed && c->senderWaiting.exchange(0, std::memory_order_seq_cst) != 0) ringBell(src);
  return tail != head;
}

// ---- the progress thread -----------------------------------------------------------------------

std::string ShmP2P::peerGone(int peer) const {
  ShmHeader* h = layout_.headers[peer];
  const uint32_t state = h->state.load(std::memory_order_acquire);
  if (state == ShmHeader::kAborted) {
    char reason[sizeof(h->reason)];
    std::memcpy(reason, h->reason, sizeof(reason));
    reason[sizeof(reason) - 1] = '\0';
    return fmt::format("shm: rank [{}] aborted while this rank waited for it in send/recv ({})", peer, reason);
  }
  if (state == ShmHeader::kClosed)
    return fmt::format("shm: rank [{}] destroyed its process group while this rank waited for it in send/recv", peer);
  if (layout_.pids[peer] != 0 && !os::processAlive(layout_.pids[peer]))
    return fmt::format("shm: rank [{}] (pid {}) died while this rank waited for it in send/recv", peer,
                       layout_.pids[peer]);
  return "";
}

bool ShmP2P::waitsOn(int peer) const {
  if (!outgoing_[peer].empty() || incoming_[peer].active) return true;
  auto it = recvs_.lower_bound(Key{peer, 0});
  return it != recvs_.end() && it->first.first == peer;
}

bool ShmP2P::findFailure(std::chrono::steady_clock::time_point now, Done& culprit, std::string& why) {
  auto take = [&](WorkPtr work, std::exception_ptr error) {
    culprit = Done{std::move(work), error, {}};
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      why = e.what();
    }
    return true;
  };
  for (int dst = 0; dst < layout_.size; ++dst) {
    auto& q = outgoing_[dst];
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->work->deadline() > now) continue;
      Outgoing o = std::move(*it);
      q.erase(it);
      return take(o.work, o.work->timeoutError(fmt::format("shm: rank {} did not take the message in time "
                                                           "({} of {} bytes sent)",
                                                           dst, o.sent, o.tensor.nbytes())));
    }
  }
  for (int src = 0; src < layout_.size; ++src) {
    Incoming& in = incoming_[src];
    if (in.recv && in.recv->work->deadline() <= now) {
      WorkPtr work = in.recv->work;
      const uint64_t got = in.received, total = in.total;
      in.recv.reset();
      in.target = nullptr;
      return take(work, work->timeoutError(fmt::format("shm: {} of the message's {} bytes from rank {} arrived in time",
                                                       got, total, src)));
    }
  }
  for (auto& [key, q] : recvs_) {
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->work->deadline() > now) continue;
      WorkPtr work = it->work;
      q.erase(it);
      if (q.empty()) recvs_.erase(key);
      return take(work, work->timeoutError(fmt::format("shm: nothing arrived from rank {} in time", key.first)));
    }
  }
  if (now - lastLiveness_ < kLivenessEvery) return false;
  lastLiveness_ = now;
  for (int peer = 0; peer < layout_.size; ++peer) {
    if (peer == layout_.rank || !waitsOn(peer)) continue;
    const std::string gone = peerGone(peer);
    if (gone.empty()) continue;
    if (!outgoing_[peer].empty()) {
      WorkPtr work = outgoing_[peer].front().work;
      outgoing_[peer].pop_front();
      return take(work, work->peerError(gone));
    }
    if (incoming_[peer].recv) {
      WorkPtr work = incoming_[peer].recv->work;
      incoming_[peer].recv.reset();
      incoming_[peer].target = nullptr;
      return take(work, work->peerError(gone));
    }
    auto it = recvs_.lower_bound(Key{peer, 0});
    if (it != recvs_.end() && it->first.first == peer) {
      WorkPtr work = it->second.front().work;
      it->second.pop_front();
      if (it->second.empty()) recvs_.erase(it);
      return take(work, work->peerError(gone));
    }
  }
  return false;
}

void ShmP2P::loop() {
  ShmHeader* me = layout_.headers[layout_.rank];
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const uint64_t bell = me->p2pBell.load(std::memory_order_seq_cst);
    std::vector<Done> done;
    Done culprit;
    std::string why;
    bool failed = false;
    bool more = false;  // a ring holds records drain() left for after the completions
    auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(kIdleSlice);
    if (!error_) {
      try {
        for (int src = 0; src < layout_.size; ++src)
          if (src != layout_.rank) more |= drain(src, done);
        for (int dst = 0; dst < layout_.size; ++dst) {
          auto& q = outgoing_[dst];
          while (!q.empty() && push(dst, q.front())) {
            done.push_back({q.front().work, nullptr, q.front().tensor});
            q.pop_front();
          }
        }
        const auto now = std::chrono::steady_clock::now();
        failed = findFailure(now, culprit, why);
        // Sleep until the next deadline of a pending op, at most until the next liveness check.
        bool pending = false;
        auto next = now + kPendingSlice;
        auto consider = [&](const WorkPtr& w) {
          pending = true;
          next = std::min(next, w->deadline());
        };
        for (auto& q : outgoing_)
          for (auto& o : q) consider(o.work);
        for (auto& in : incoming_)
          if (in.recv) consider(in.recv->work);
        for (auto& [key, q] : recvs_)
          for (auto& r : q) consider(r.work);
        if (pending) slice = std::max<std::chrono::nanoseconds>(next - now, std::chrono::milliseconds(1));
      } catch (const DistError& e) {
        failed = true;
        why = e.what();
      }
    }
    lock.unlock();
    complete(key_, done);
    if (failed) {
      // The group is broken before the culprit's waiter wakes: an op it issues next must fail at
      // once rather than slip into the ring ahead of the break.
      breakGroup_(why);  // calls abort(): every other pending op fails with the group's error
      if (culprit.work) {
        std::vector<Done> one{std::move(culprit)};
        complete(key_, one);
      }
    }
    if (more && !failed) {
      lock.lock();
      continue;
    }
    me->p2pSleeping.store(1, std::memory_order_seq_cst);
    if (me->p2pBell.load(std::memory_order_seq_cst) == bell)
      os::futexWait(&me->p2pBell, static_cast<uint32_t>(bell), slice);
    me->p2pSleeping.store(0, std::memory_order_seq_cst);
    lock.lock();
  }
}

void ShmP2P::abort(std::exception_ptr error) {
  std::vector<Done> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = error;
    for (auto& q : outgoing_) {
      for (auto& o : q) done.push_back({o.work, error_, {}});
      q.clear();
    }
    for (auto& in : incoming_) {
      if (in.recv) done.push_back({in.recv->work, error_, {}});
      in = Incoming{};
    }
    for (auto& [key, q] : recvs_)
      for (auto& r : q) done.push_back({r.work, error_, {}});
    recvs_.clear();
    unexpected_.clear();
  }
  complete(key_, done);
}

}  // namespace cohort::dist::shm_backend
