// ShmBackend: segments, rounds, waiting, failure handling and registration (the collectives
// themselves are in shm_ops.cc).
#include <cohort/distributed/shm/shm_backend.h>

#include <dirent.h>
#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <new>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/detail/op_queue.h>
#include <cohort/distributed/shm/detail/futex.h>
#include <cohort/distributed/shm/shm_p2p.h>

namespace cohort::dist::shm_backend {

COHORT_ENV_KNOB(kSlotBytes, "COHORT_SHM_SLOT_BYTES", "4194304",
                "Bytes of each of the two slots of a rank's shared-memory segment (shm backend)");
COHORT_ENV_KNOB(kSmallBytes, "COHORT_SHM_SMALL_BYTES", "32768",
                "Largest allreduce (bytes) the shm backend does in one round, every rank reducing everything");
COHORT_ENV_KNOB(kMaxBufferBytes, "COHORT_SHM_MAX_BUFFER_BYTES", "0",
                "Largest buffer (bytes) allocateCommBuffer places in /dev/shm, e.g. DDP's buckets (0: no cap); "
                "larger ones are plain memory, reduced through the slots");
COHORT_ENV_KNOB(kP2PBytes, "COHORT_SHM_P2P_BYTES", "1048576",
                "Bytes of each send/recv ring of the shm backend (one per destination rank; a message that "
                "fits is copied in by the sender at once)");
COHORT_ENV_KNOB(kSpinUs, "COHORT_SHM_SPIN_US", "20",
                "Microseconds the shm backend spins on a peer's counter before sleeping on a futex");

namespace {

constexpr uint64_t kMagic = 0x636f686f72747368ULL;  // "cohortsh"
constexpr size_t kHeaderBytes = 4096;
constexpr uint32_t kLive = ShmHeader::kLive, kAborted = ShmHeader::kAborted, kClosed = ShmHeader::kClosed;
constexpr auto kSleepSlice = std::chrono::milliseconds(100);
constexpr auto kLivenessAfter = std::chrono::milliseconds(100);

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(ShmHeader) <= kHeaderBytes);

ShmHeader* header(uint8_t* base) { return reinterpret_cast<ShmHeader*>(base); }

using os::futexWait;
using os::futexWakeAll;
using os::processAlive;

std::string sanitize(const std::string& group) {
  std::string out;
  for (char c : group) {
    out.push_back((std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '_');
    if (out.size() >= 48) break;
  }
  return out;
}

std::string makeToken() {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:x}{:012x}", getpid(), r & 0xffffffffffffULL);
}

uint64_t pidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::string withErrno(const std::string& what) { return fmt::format("{}: {}", what, std::strerror(errno)); }

// Creates the shared object `name` of `bytes`, reserves its pages now (a full /dev/shm is an
// error here rather than a SIGBUS at first touch) and maps it. Null, and `error` saying what
// failed and why, on failure. Segments and registered buffers are made alike.
uint8_t* createShared(const std::string& name, size_t bytes, std::string& error) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = withErrno(fmt::format("cannot create shared memory object {}", name));
    return nullptr;
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    error = withErrno(fmt::format("cannot size {} to {} bytes", name, bytes));
  } else if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    errno = e;
    error = withErrno(fmt::format("cannot reserve {} bytes in /dev/shm for {}", bytes, name));
  } else if (p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); p == MAP_FAILED) {
    error = withErrno(fmt::format("cannot map {}", name));
  }
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// Maps `bytes` of another rank's shared object `name`; null and `error` on failure.
uint8_t* mapShared(const std::string& name, size_t bytes, std::string& error) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    error = withErrno(fmt::format("cannot open {}", name));
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) error = withErrno(fmt::format("cannot map {}", name));
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// ---- names a terminating signal removes (see "Cleanup" in the header) ----------------------------

// A name this process created and has not unlinked yet, as the path unlink() takes (shm_open's
// objects live in /dev/shm on Linux; unlink, unlike shm_unlink, is async-signal-safe).
struct PendingName {
  std::atomic<int> state{0};  // kFree, kBusy (being written or cleared), kHeld
  char path[NAME_MAX + 16];
};
constexpr int kFree = 0, kBusy = 1, kHeld = 2;
constexpr int kMaxPendingNames = 64;
PendingName gPending[kMaxPendingNames];
constexpr int kCleanupSignals[] = {SIGTERM, SIGINT, SIGHUP};

std::mutex gHandlerMu;
int gHandlerUsers = 0;                                    // live PendingUnlinks (under gHandlerMu)
bool gHandlerInstalled[std::size(kCleanupSignals)] = {};  // which signals carry onTerminatingSignal

void onTerminatingSignal(int sig) {
  const int savedErrno = errno;
  for (PendingName& p : gPending)
    if (p.state.load(std::memory_order_acquire) == kHeld) ::unlink(p.path);
  // Then die of the signal as if no handler had been there: it is blocked while this handler
  // runs, so the raised one arrives when the handler returns.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
  errno = savedErrno;
}

// While it lives, `name` is on the list that onTerminatingSignal unlinks, and the handler is in
// place for every cleanup signal whose disposition was the default (a program's own handler or
// SIG_IGN is left alone). The last one to go puts the default back where the handler still is.
class PendingUnlink {
 public:
  explicit PendingUnlink(const std::string& name) {
    {
      std::lock_guard<std::mutex> lock(gHandlerMu);
      if (gHandlerUsers++ == 0) {
        for (size_t i = 0; i < std::size(kCleanupSignals); ++i) {
          struct sigaction old {};
          if (sigaction(kCleanupSignals[i], nullptr, &old) != 0) continue;
          if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
          struct sigaction sa {};
          sa.sa_handler = onTerminatingSignal;
          sigemptyset(&sa.sa_mask);
          gHandlerInstalled[i] = sigaction(kCleanupSignals[i], &sa, nullptr) == 0;
        }
      }
    }
    const std::string path = "/dev/shm" + name;
    if (path.size() >= sizeof(PendingName::path)) return;
    for (PendingName& p : gPending) {
      int expected = kFree;
      if (!p.state.compare_exchange_strong(expected, kBusy)) continue;
      std::memcpy(p.path, path.c_str(), path.size() + 1);
      p.state.store(kHeld, std::memory_order_release);
      slot_ = &p;
      return;
    }
    // All slots taken (more than kMaxPendingNames setups at once): this name goes untracked.
  }
  ~PendingUnlink() {
    if (slot_) slot_->state.store(kFree, std::memory_order_release);
    std::lock_guard<std::mutex> lock(gHandlerMu);
    if (--gHandlerUsers > 0) return;
    for (size_t i = 0; i < std::size(kCleanupSignals); ++i) {
      if (!gHandlerInstalled[i]) continue;
      gHandlerInstalled[i] = false;
      struct sigaction cur {};
      if (sigaction(kCleanupSignals[i], nullptr, &cur) != 0) continue;
      if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == onTerminatingSignal) ::signal(kCleanupSignals[i], SIG_DFL);
    }
  }
  PendingUnlink(const PendingUnlink&) = delete;
  PendingUnlink& operator=(const PendingUnlink&) = delete;

 private:
  PendingName* slot_ = nullptr;
};

// Removes the segments that processes of this pid namespace left in /dev/shm when they died
// without running a handler (SIGKILL, a crash) while their names were still up: a
// "cohort_*" object with this backend's header whose owner no longer runs. Buffers
// ("..._b<id>") have no header and are left alone; so is anything another user owns, anything
// not yet initialised (no magic) and anything whose owner is alive or in another pid namespace.
void sweepStaleSegments(uint64_t ns) {
  if (ns == 0) return;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  std::vector<std::string> stale;
  while (const dirent* e = readdir(dir)) {
    const std::string name = std::string("/") + e->d_name;
    if (name.rfind("/cohort_", 0) != 0) continue;
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    struct stat st {};
    void* p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kHeaderBytes))
      p = mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) continue;
    // The owner writes its pid into a zeroed header: 0 is "not yet", anything else is the owner.
    const auto* h = static_cast<const ShmHeader*>(p);
    const int pid = h->pid, rank = h->rank;
    const bool dead = h->magic == kMagic && h->pidNamespace == ns && pid > 0 && pid != getpid() && !processAlive(pid);
    munmap(p, kHeaderBytes);
    if (dead && shm_unlink(name.c_str()) == 0) stale.push_back(fmt::format("{} (rank {}, pid {})", name, rank, pid));
  }
  closedir(dir);
  if (!stale.empty())
    COHORT_LOG(Warning, "shm backend: removed {} segment(s) left in /dev/shm by processes that died during setup: {}",
               stale.size(), fmt::join(stale, ", "));
}

}  // namespace

ShmConfig ShmConfig::fromEnv() {
  ShmConfig c;
  const int64_t slot = kSlotBytes.integer();
  if (slot < 4096 || slot > (int64_t(1) << 32)) {
    throw ValueError(fmt::format("COHORT_SHM_SLOT_BYTES must be between 4096 and 2^32, got {}", slot));
  }
  c.slotBytes = static_cast<size_t>(slot);
  c.smallBytes = static_cast<size_t>(std::max<int64_t>(0, kSmallBytes.integer()));
  c.spin = std::chrono::microseconds(std::max<int64_t>(0, kSpinUs.integer()));
  const int64_t maxBuffer = kMaxBufferBytes.integer();
  if (maxBuffer < 0) throw ValueError(fmt::format("COHORT_SHM_MAX_BUFFER_BYTES must be 0 or more, got {}", maxBuffer));
  c.maxBufferBytes = static_cast<size_t>(maxBuffer);
  const int64_t p2p = kP2PBytes.integer();
  if (p2p < 4096 || p2p > (int64_t{1} << 30))
    throw ValueError(fmt::format("COHORT_SHM_P2P_BYTES must be between 4096 and 1073741824, got {}", p2p));
  c.p2pBytes = static_cast<size_t>(p2p);
  c.worker = collectiveThreadFromEnv() == CollectiveThread::Worker;
  return c;
}

ShmBackend::ShmBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts, const ShmConfig& config)
    : Backend("shm", rank, size), group_(opts.groupName) {
  // At least 64 bytes per rank and one more (the allreduce's chunk + slice; alltoall's regions).
  slotBytes_ = roundUp(std::max<size_t>({config.slotBytes, 4096, 64 * static_cast<size_t>(size + 1)}), 4096);
  smallBytes_ = std::min(config.smallBytes, slotBytes_);
  spin_ = config.spin;
  maxBufferBytes_ = config.maxBufferBytes;
  p2pBytes_ = roundUp(config.p2pBytes, 4096);
  mapBytes_ = kHeaderBytes + 2 * slotBytes_ + ShmP2P::regionBytes(size, p2pBytes_);
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;

  // The token: drawn by rank 0, shared through the group's store.
  if (rank == 0) store->set("shm/token", makeToken());
  store->wait({"shm/token"}, opts.timeout);
  const std::string token = store->getString("shm/token");
  names_.resize(size);
  bases_.assign(size, nullptr);
  pids_.assign(size, 0);
  for (int r = 0; r < size; ++r) names_[r] = fmt::format("/cohort_{}_{}_{}", token, sanitize(group_), r);

  auto fail = [&](const std::string& what) {
    int err = errno;
    unlinkAll();
    for (uint8_t*& b : bases_) {
      if (b) munmap(b, mapBytes_);
      b = nullptr;
    }
    throw DistError(fmt::format("shm backend: rank {} of group '{}': {}{}", rank, group_, what,
                                err ? fmt::format(": {}", std::strerror(err)) : std::string()));
  };

  // This rank's segment. Its name stays on the signal handler's list until it is unlinked.
  const uint64_t ns = pidNamespace();
  sweepStaleSegments(ns);
  std::optional<PendingUnlink> pending(std::in_place, names_[rank]);
  std::string err;
  uint8_t* mine = createShared(names_[rank], mapBytes_, err);
  if (!mine) {
    errno = 0;
    fail(err);
  }
  bases_[rank] = mine;
  auto* h = new (mine) ShmHeader{};
  h->magic = kMagic;
  h->pid = getpid();
  h->rank = rank;
  h->slotBytes = slotBytes_;
  h->pidNamespace = ns;
  h->p2pRingBytes = p2pBytes_;
  ShmP2P::initRegion(mine + p2pOffset(), size);
  h->counter.store(0);
  h->waiters.store(0);
  h->state.store(kLive);
  pids_[rank] = 0;
  store->set(fmt::format("shm/seg/{}", rank), names_[rank]);

  // The peers' segments.
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    if (r != rank) keys.push_back(fmt::format("shm/seg/{}", r));
  try {
    if (!keys.empty()) store->wait(keys, opts.timeout);
  } catch (const std::exception& e) {
    errno = 0;
    fail(fmt::format("peers did not announce their segments: {}", e.what()));
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    bases_[r] = mapShared(names_[r], mapBytes_, err);
    if (!bases_[r]) {
      errno = 0;
      fail(fmt::format("rank {}'s segment: {} (is it on this host?)", r, err));
    }
    ShmHeader* ph = header(bases_[r]);
    if (ph->magic != kMagic || ph->rank != r || ph->slotBytes != slotBytes_ || ph->p2pRingBytes != p2pBytes_) {
      errno = 0;
      fail(fmt::format("rank {}'s segment {} does not match (slot bytes {} here, {} there; send/recv ring bytes "
                       "{} here, {} there: set COHORT_SHM_SLOT_BYTES and COHORT_SHM_P2P_BYTES alike on every rank)",
                       r, names_[r], slotBytes_, ph->slotBytes, p2pBytes_, ph->p2pRingBytes));
    }
    // A peer's pid means something here only in the same pid namespace, and in another process.
    pids_[r] = (ph->pidNamespace == h->pidNamespace && h->pidNamespace != 0 && ph->pid != h->pid) ? ph->pid : 0;
  }
  // Meet once over shared memory: then every peer has mapped this rank's segment, and its name can go.
  try {
    sync(deadline, "setup");
  } catch (const Failure& f) {
    errno = 0;
    fail(fmt::format("peers did not map the segments: {}", f.detail));
  }
  shm_unlink(names_[rank].c_str());
  pending.reset();

  if (size > 1) {
    ShmP2P::Layout layout;
    layout.rank = rank;
    layout.size = size;
    layout.group = group_;
    layout.pids = pids_;
    layout.ringBytes = p2pBytes_;
    for (int r = 0; r < size; ++r) {
      layout.headers.push_back(header(bases_[r]));
      layout.regions.push_back(bases_[r] + p2pOffset());
    }
    p2p_ = std::make_unique<ShmP2P>(completionKey(), std::move(layout),
                                    [this](const std::string& why) { breakWith(why); });
  }
  if (config.worker) ops_ = std::make_unique<OpQueue>(completionKey());
}

ShmBackend::~ShmBackend() {
  if (ops_) ops_->stop();  // ops still queued fail: the group was destroyed before they ran
  p2p_.reset();            // its thread reads the segments; pending sends and recvs fail
  if (bases_[rank()]) {
    ShmHeader* h = header(bases_[rank()]);
    uint32_t live = kLive;
    h->state.compare_exchange_strong(live, kClosed);
    futexWakeAll(&h->counter);
  }
  shm_unlink(names_[rank()].c_str());
  for (uint8_t* b : bases_)
    if (b) munmap(b, mapBytes_);
}

bool ShmBackend::supports(OpType /*op*/) const { return true; }

size_t ShmBackend::p2pOffset() const { return kHeaderBytes + 2 * slotBytes_; }

uint8_t* ShmBackend::slot(int r, uint64_t round) const { return bases_[r] + kHeaderBytes + (round & 1) * slotBytes_; }

void ShmBackend::signal() {
  ShmHeader* h = header(bases_[rank()]);
  h->counter.store(round_, std::memory_order_seq_cst);
  if (h->waiters.load(std::memory_order_seq_cst) != 0) futexWakeAll(&h->counter);
}

void ShmBackend::sync(Deadline deadline, const char* what) {
  ++round_;
  signal();
  for (int p = 0; p < size(); ++p)
    if (p != rank()) waitPeer(p, round_, deadline, what);
}

void ShmBackend::waitPeer(int peer, uint64_t target, Deadline deadline, const char* what) {
  ShmHeader* h = header(bases_[peer]);
  if (h->counter.load(std::memory_order_acquire) >= target) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto spinEnd = start + spin_;
  do {
    for (int i = 0; i < 64; ++i) {
      if (h->counter.load(std::memory_order_acquire) >= target) return;
      _mm_pause();
    }
  } while (Clock::now() < spinEnd);

  auto lastLiveness = start;
  while (true) {
    if (h->counter.load(std::memory_order_acquire) >= target) return;
    const uint32_t state = h->state.load(std::memory_order_acquire);
    if (state == kAborted) {
      char reason[sizeof(h->reason)];
      std::memcpy(reason, h->reason, sizeof(reason));
      reason[sizeof(reason) - 1] = '\0';
      throw Failure{false,
                    fmt::format("shm: rank [{}] aborted while this rank waited for it in {} ({})", peer, what, reason)};
    }
    if (state == kClosed) {
      throw Failure{false, fmt::format("shm: rank [{}] destroyed its process group while this rank waited for it "
                                       "in {}",
                                       peer, what)};
    }
    const auto now = Clock::now();
    if (now - start >= kLivenessAfter && now - lastLiveness >= kLivenessAfter && pids_[peer] != 0) {
      lastLiveness = now;
      if (!processAlive(pids_[peer])) {
        throw Failure{false, fmt::format("shm: rank [{}] (pid {}) died while this rank waited for it in {}", peer,
                                         pids_[peer], what)};
      }
    }
    if (now >= deadline) {
      throw Failure{true, fmt::format("shm: rank [{}] did not reach step {} of {} in time (it is at step {})", peer,
                                      target, what, h->counter.load())};
    }
    auto slice = std::min<std::chrono::nanoseconds>(deadline - now, kSleepSlice);
    h->waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t seen = h->counter.load(std::memory_order_seq_cst);
    if (seen < target && h->state.load(std::memory_order_seq_cst) == kLive) {
      futexWait(&h->counter, static_cast<uint32_t>(seen), slice);
    }
    h->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmBackend::breakWith(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(errMu_);
    if (broken_.load()) return;
    brokenMessage_ = message;
    broken_.store(true);
  }
  ShmHeader* h = header(bases_[rank()]);
  if (h->state.load() == kLive) {
    std::strncpy(h->reason, message.c_str(), sizeof(h->reason) - 1);
    h->reason[sizeof(h->reason) - 1] = '\0';
  }
  uint32_t live = kLive;
  h->state.compare_exchange_strong(live, kAborted);
  futexWakeAll(&h->counter);
  // Names are normally gone already; after a failure during setup, remove what anyone left.
  unlinkAll();
  if (p2p_) p2p_->abort(std::make_exception_ptr(brokenError()));
}

PeerError ShmBackend::brokenError() const {
  std::lock_guard<std::mutex> lock(errMu_);
  return PeerError(
      fmt::format("shm backend of group '{}' was aborted by an earlier error: {}", group_, brokenMessage_));
}

void ShmBackend::unlinkAll() {
  for (const std::string& n : names_) shm_unlink(n.c_str());
}

void ShmBackend::abort(const std::string& reason) { breakWith(reason); }

// ---- descriptors and registered buffers --------------------------------------------------------

void ShmBackend::publishDesc(const Desc& d) {
  uint64_t* slot = header(bases_[rank()])->desc[(round_ + 1) & 1];
  slot[0] = d.kind;
  slot[1] = d.id;
  slot[2] = d.offset;
  slot[3] = d.bytes;
}

ShmBackend::Desc ShmBackend::peerDesc(int peer) const {
  const uint64_t* slot = header(bases_[peer])->desc[round_ & 1];
  return Desc{slot[0], slot[1], slot[2], slot[3]};
}

bool ShmBackend::findRegistered(const void* data, size_t bytes, Desc& desc, std::vector<uint8_t*>& bases) const {
  const auto* p = static_cast<const uint8_t*>(data);
  std::lock_guard<std::mutex> lock(buffers_->mu);
  for (const CommBuffer& b : buffers_->list) {
    const uint8_t* base = b.bases[rank()];
    if (p >= base && p + bytes <= base + b.bytes) {
      desc = Desc{Desc::kRegistered, b.id, static_cast<uint64_t>(p - base), bytes};
      bases = b.bases;
      return true;
    }
  }
  return false;
}

Tensor ShmBackend::allocateCommBuffer(const Shape& sizes, DType dtype, Millis timeout) {
  // One rank: nothing to share. Worker mode: the rounds belong to the worker thread.
  if (size() == 1 || ops_) return Backend::allocateCommBuffer(sizes, dtype, timeout);
  const size_t bytes = static_cast<size_t>(shapeNumel(sizes)) * elementSize(dtype);
  const size_t mapBytes = roundUp(std::max<size_t>(bytes, 1), 4096);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int n = size(), r = rank();

  std::lock_guard<std::mutex> lock(opMu_);
  if (broken_.load()) throw brokenError();
  const uint64_t id = nextBufferId_++;
  auto nameOf = [&](int q) { return fmt::format("{}_b{}", names_[q], id); };
  std::vector<uint8_t*> bases(n, nullptr);
  auto unmapAll = [&] {
    for (uint8_t*& b : bases) {
      if (b) munmap(b, mapBytes);
      b = nullptr;
    }
  };
  // Every rank states what it asked for and whether its step worked; all read the same
  // descriptors, so all decide alike and stay in step even when one rank fails.
  auto agree = [&](const std::string& myError, const char* step) {
    publishDesc(Desc{Desc::kAlloc, id, myError.empty() ? 1u : 0u, bytes});
    sync(deadline, "allocateCommBuffer");
    std::vector<Desc> all(n);
    for (int q = 0; q < n; ++q) all[q] = peerDesc(q);  // this rank's own too: what it published
    std::vector<std::string> bad;
    for (int q = 0; q < n; ++q)
      if (all[q].kind != Desc::kAlloc || all[q].id != id)
        bad.push_back(fmt::format("rank {} is not allocating buffer {} (a different collective?)", q, id));
    if (bad.empty() && std::any_of(all.begin(), all.end(), [&](const Desc& d) { return d.bytes != bytes; })) {
      std::vector<std::string> sizes;
      for (int q = 0; q < n; ++q) sizes.push_back(fmt::format("rank {} {} bytes", q, all[q].bytes));
      bad.push_back(fmt::format("the ranks asked for different sizes ({})", fmt::join(sizes, ", ")));
    }
    if (!bad.empty()) {
      shm_unlink(nameOf(r).c_str());
      unmapAll();
      throw DistError(fmt::format("shm backend: allocateCommBuffer in group '{}' (buffer {}, shape {}, {}): {}", group_,
                                  id, shapeStr(sizes), dtype, fmt::join(bad, "; ")));
    }
    // A rank that could not make or map its buffer (a full /dev/shm, the size cap) is no misuse:
    // every rank falls back to plain memory together.
    std::vector<std::string> failed;
    for (int q = 0; q < n; ++q)
      if (all[q].offset != 1) failed.push_back(fmt::format("rank {}", q));
    if (failed.empty()) return std::string();
    shm_unlink(nameOf(r).c_str());
    unmapAll();
    return fmt::format("{} could not {}{}", fmt::join(failed, ", "), step,
                       myError.empty() ? std::string() : " (here: " + myError + ")");
  };
  auto fallBack = [&](const std::string& why) {
    COHORT_LOG(Warning,
               "shm backend: buffer {} of group '{}' ({} bytes) is plain memory, reduced through the slots: {}", id,
               group_, bytes, why);
    return Backend::allocateCommBuffer(sizes, dtype, timeout);
  };
  // This rank's name stays on the signal handler's list until it is unlinked (every path out).
  PendingUnlink pending(nameOf(r));
  try {
    std::string err;
    if (maxBufferBytes_ != 0 && bytes > maxBufferBytes_) {
      err = fmt::format("{} bytes are more than COHORT_SHM_MAX_BUFFER_BYTES ({})", bytes, maxBufferBytes_);
    } else {
      bases[r] = createShared(nameOf(r), mapBytes, err);
    }
    if (std::string why = agree(err, "create a buffer"); !why.empty()) return fallBack(why);
    // The peers' objects (every size was checked alike above).
    for (int q = 0; q < n && err.empty(); ++q) {
      if (q == r) continue;
      bases[q] = mapShared(nameOf(q), mapBytes, err);
      if (!bases[q]) err = fmt::format("rank {}'s buffer: {}", q, err);
    }
    if (std::string why = agree(err, "map the others' buffers"); !why.empty()) return fallBack(why);
  } catch (const Failure& f) {
    for (int q = 0; q < n; ++q) shm_unlink(nameOf(q).c_str());
    unmapAll();
    breakWith(fmt::format("allocateCommBuffer failed: {}", f.detail));
    if (f.timeout)
      throw TimeoutError(fmt::format("shm backend: allocateCommBuffer in group '{}': {}", group_, f.detail));
    throw PeerError(fmt::format("shm backend: allocateCommBuffer in group '{}': {}", group_, f.detail));
  }
  // Every rank has mapped every buffer: the names can go.
  shm_unlink(nameOf(r).c_str());
  {
    std::lock_guard<std::mutex> g(buffers_->mu);
    buffers_->list.push_back(CommBuffer{id, bytes, mapBytes, bases});
  }
  auto deleter = [buffers = buffers_, id](void*) {
    std::lock_guard<std::mutex> g(buffers->mu);
    auto it = std::find_if(buffers->list.begin(), buffers->list.end(), [&](const CommBuffer& b) { return b.id == id; });
    if (it == buffers->list.end()) return;
    for (uint8_t* b : it->bases)
      if (b) munmap(b, it->mapBytes);
    buffers->list.erase(it);
  };
  auto storage = std::make_shared<Storage>(bases[r], bytes, Device::cpu(), std::move(deleter));
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, sizes, contiguousStrides(sizes), dtype));
}

// ---- point to point (shm_p2p.h) ----------------------------------------------------------------

uint64_t ShmBackend::bufferedMessages() const { return p2p_ ? p2p_->bufferedMessages() : 0; }

void ShmBackend::send(const Tensor& tensor, int dst, const SendRecvOptions& opts, const WorkPtr& work) {
  if (broken_.load()) {
    work->fail(completionKey(), std::make_exception_ptr(brokenError()));
    return;
  }
  if (!p2p_) unsupported(OpType::Send);
  p2p_->send(tensor, dst, opts.tag, work);
}

void ShmBackend::recv(Tensor& tensor, int src, const SendRecvOptions& opts, const WorkPtr& work) {
  if (broken_.load()) {
    work->fail(completionKey(), std::make_exception_ptr(brokenError()));
    return;
  }
  if (!p2p_) unsupported(OpType::Recv);
  p2p_->recv(tensor, src, opts.tag, work);
}

// ---- registration --------------------------------------------------------------------------

namespace {
const bool kRegistered = [] {
  registerBackend("shm", [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
    return std::make_shared<ShmBackend>(store, rank, size, opts);
  });
  return true;
}();
}  // namespace

}  // namespace cohort::dist::shm_backend
