#include <cohort/distributed/debug/flight_recorder.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/env/environment.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kRecorderDir, "COHORT_FLIGHT_RECORDER_DIR", "/tmp",
                "Folder the flight recorder's JSON dumps (on timeout, error and SIGUSR1) are written to");
COHORT_ENV_KNOB(
    kRecorderSignal, "COHORT_FLIGHT_RECORDER_SIGUSR1", "1",
    "Install a SIGUSR1 handler that dumps every process group's flight recorder (0 to leave SIGUSR1 alone)");

namespace {

int64_t unixMicros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

void appendJsonString(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

// Writes `text` to `path` whole: a reader sees the old file or the new one, never half of one.
// The temporary name is unique per call: several threads of one process (ranks as threads, or two
// groups failing at once) may dump to the same path together, and each must rename its own file.
void writeFileAtomically(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = fmt::format("{}.tmp{}.{}", path, ::getpid(), counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw Error(fmt::format("flight recorder: cannot create {}: {}", tmp, std::strerror(errno)));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  int err = errno;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("flight recorder: cannot write {}: {}", path, std::strerror(err)));
  }
}

// ---- the process-wide registry and the SIGUSR1 dump thread ------------------------------------

struct Registry {
  std::mutex mu;
  std::set<const FlightRecorder*> recorders;
  std::atomic<int> processRank{-1};
  std::atomic<uint64_t> signalDumps{0};
  // Signal state: guarded by mu, except writeFd which the handler reads.
  bool signalTried = false;
  bool threadRunning = false;
  int readFd = -1;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: the dump thread and atfork use it to the end
  return *r;
}
std::atomic<int> gSignalWriteFd{-1};  // lock-free: read by the signal handler

extern "C" void onSigusr1(int) {
  int saved = errno;
  int fd = gSignalWriteFd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    char b = 1;
    [[maybe_unused]] ssize_t n = ::write(fd, &b, 1);  // non-blocking: a full pipe already has a dump pending
  }
  errno = saved;
}

void dumpThreadMain(int fd) {
  char buf[64];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the pipe was closed (after fork in a child: not reached there)
    dumpFlightRecorders("SIGUSR1");
    registry().signalDumps.fetch_add(1);
  }
}

// fork(): the registry lock must not be held by a thread that does not exist in the child, and
// the child has no dump thread reading the parent's pipe.
void atforkPrepare() { registry().mu.lock(); }
void atforkParent() { registry().mu.unlock(); }
void atforkChild() {
  Registry& r = registry();
  int w = gSignalWriteFd.exchange(-1);
  if (w >= 0) ::close(w);
  if (r.readFd >= 0) ::close(r.readFd);
  r.readFd = -1;
  r.threadRunning = false;
  r.signalTried = false;
  r.mu.unlock();
}

// Called with r.mu held.
bool installLocked(Registry& r) {
  if (r.threadRunning) return true;
  if (r.signalTried) return false;
  r.signalTried = true;
  static std::once_flag atforkOnce;
  std::call_once(atforkOnce, [] { ::pthread_atfork(atforkPrepare, atforkParent, atforkChild); });
  bool enabled = true;
  try {
    enabled = kRecorderSignal.flag();
  } catch (const ValueError& e) {
    COHORT_LOG(Warning, "flight recorder: {}; SIGUSR1 dumps stay enabled", e.what());
  }
  if (!enabled) return false;
  struct sigaction old {};
  ::sigaction(SIGUSR1, nullptr, &old);
  bool ours = (old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == onSigusr1;
  if (!ours && ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL)) {
    COHORT_LOG(Warning, "flight recorder: SIGUSR1 already has a handler; not installing the dump handler "
                        "(call dumpFlightRecorders() from yours)");
    return false;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    COHORT_LOG(Warning, "flight recorder: pipe2 failed ({}); no SIGUSR1 dumps", std::strerror(errno));
    return false;
  }
  // The reader blocks; only the handler's end must never block.
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) & ~O_NONBLOCK);
  try {
    std::thread(dumpThreadMain, fds[0]).detach();
  } catch (const std::system_error& e) {
    ::close(fds[0]);
    ::close(fds[1]);
    COHORT_LOG(Warning, "flight recorder: cannot start the dump thread ({}); no SIGUSR1 dumps", e.what());
    return false;
  }
  r.readFd = fds[0];
  gSignalWriteFd.store(fds[1]);
  if (!ours) {
    struct sigaction sa {};
    sa.sa_handler = onSigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  }
  r.threadRunning = true;
  return true;
}

std::string processRankText() {
  int rank = registry().processRank.load();
  if (rank >= 0) return std::to_string(rank);
  try {
    return std::to_string(env::detectEnvironment().rank);
  } catch (const std::exception&) {
    return "unknown";
  }
}

}  // namespace

const char* flightStateName(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Scheduled: return "scheduled";
    case FlightRecorder::State::Completed: return "completed";
    case FlightRecorder::State::Failed: return "failed";
  }
  return "unknown";
}

FlightRecorder::FlightRecorder(std::string group, size_t capacity, int rank)
    : group_(std::move(group)), capacity_(capacity), rank_(rank) {
  ring_.reserve(capacity_);  // address space only; slots are built as ops arrive
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.recorders.insert(this);
  installLocked(r);
}

FlightRecorder::~FlightRecorder() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);  // a dump in progress finishes with this recorder first
  r.recorders.erase(this);
}

void FlightRecorder::setRank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_ = rank;
}

uint64_t FlightRecorder::recordStart(OpType op, uint64_t seq, std::string shapes, std::string dtype,
                                     std::string detail) {
  return record(seq, opTypeName(op), std::move(shapes), std::move(detail), std::move(dtype));
}

FlightRecorder::Slot& FlightRecorder::claimSlot(uint64_t seq, std::chrono::steady_clock::time_point start,
                                                uint64_t& id) {
  id = nextId_++;
  if (ring_.size() < capacity_) ring_.emplace_back();
  Slot& e = ring_[(id - 1) % capacity_];
  e.id = id;
  e.seq = seq;
  e.start = start;
  e.end = {};
  e.state = State::Scheduled;
  e.error.clear();
  return e;
}

uint64_t FlightRecorder::record(uint64_t seq, std::string op, std::string shapes, std::string detail,
                                std::string dtype) {
  if (capacity_ == 0) return 0;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id;
  Slot& e = claimSlot(seq, now, id);
  e.opIsText = true;
  e.opText = std::move(op);
  e.shapes = std::move(shapes);
  e.dtype = std::move(dtype);
  e.detail = std::move(detail);
  return id;
}

uint64_t FlightRecorder::recordInPlace(uint64_t seq, OpType op, FillFn fill,
                                       std::chrono::steady_clock::time_point start) {
  if (capacity_ == 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id;
  Slot& e = claimSlot(seq, start, id);
  e.opIsText = false;
  e.opType = op;
  e.shapes.clear();
  e.dtype.clear();
  e.detail.clear();
  if (fill) fill(e.shapes, e.detail);
  prefetchSlot(id);
  return id;
}

// Once the ring has wrapped, the next op reuses a slot last written `capacity_` ops ago, long gone
// from the caches (2000 slots of ~200 bytes): warm its lines now, while the op runs, instead of
// taking four cache misses on the next op's path (perf: 14% of a 4-byte MPI allreduce's time was
// these first stores).
void FlightRecorder::prefetchSlot(uint64_t id) const {
  if (ring_.size() < capacity_) return;
  const char* next = reinterpret_cast<const char*>(&ring_[id % capacity_]);
  for (size_t off = 0; off < sizeof(Slot); off += 64) __builtin_prefetch(next + off, 1, 3);
}

void FlightRecorder::complete(uint64_t id, State state, std::string error) {
  if (id == 0 || capacity_ == 0) return;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  Slot& e = ring_[(id - 1) % capacity_];
  if (e.id != id) return;  // overwritten by a newer op
  e.end = now;
  e.state = state;
  if (!error.empty()) e.error = std::move(error);
}

uint64_t FlightRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nextId_ - 1;
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  if (ring_.empty()) return out;
  out.reserve(ring_.size());
  // Oldest first: once the ring has wrapped, the oldest sits at the slot the next id will take.
  size_t startSlot = ring_.size() < capacity_ ? 0 : (nextId_ - 1) % capacity_;
  // Steady times to wall-clock ones, with one reading of each clock.
  const auto sysNow = std::chrono::system_clock::now();
  const auto steadyNow = std::chrono::steady_clock::now();
  auto wall = [&](std::chrono::steady_clock::time_point t) {
    return sysNow - std::chrono::duration_cast<std::chrono::system_clock::duration>(steadyNow - t);
  };
  for (size_t i = 0; i < ring_.size(); ++i) {
    const Slot& s = ring_[(startSlot + i) % ring_.size()];
    Entry e;
    e.id = s.id;
    e.seq = s.seq;
    e.op = s.opIsText ? s.opText : opTypeName(s.opType);
    e.shapes = s.shapes;
    e.dtype = s.dtype;
    e.detail = s.detail;
    e.start = wall(s.start);
    if (s.state != State::Scheduled) e.end = wall(s.end);
    e.state = s.state;
    e.error = s.error;
    out.push_back(std::move(e));
  }
  return out;
}

std::string FlightRecorder::dumpJson() const {
  std::vector<Entry> es = entries();
  int rank;
  uint64_t total;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rank = rank_;
    total = nextId_ - 1;
  }
  std::string out = "{\"group\": ";
  appendJsonString(out, group_);
  out += fmt::format(", \"rank\": {}, \"capacity\": {}, \"recorded\": {}, \"entries\": [", rank, capacity_, total);
  for (size_t i = 0; i < es.size(); ++i) {
    const Entry& e = es[i];
    out += i == 0 ? "\n  " : ",\n  ";
    out += fmt::format("{{\"id\": {}, \"seq\": {}, \"op\": ", e.id, e.seq);
    appendJsonString(out, e.op);
    out += ", \"shapes\": ";
    appendJsonString(out, e.shapes);
    out += ", \"dtype\": ";
    appendJsonString(out, e.dtype);
    out += ", \"detail\": ";
    appendJsonString(out, e.detail);
    out += fmt::format(", \"state\": \"{}\", \"start_us\": {}", flightStateName(e.state), unixMicros(e.start));
    if (e.state == State::Scheduled) {
      out += ", \"end_us\": null, \"duration_us\": null";
    } else {
      out += fmt::format(", \"end_us\": {}, \"duration_us\": {}", unixMicros(e.end),
                         unixMicros(e.end) - unixMicros(e.start));
    }
    out += ", \"error\": ";
    appendJsonString(out, e.error);
    out += "}";
  }
  out += es.empty() ? "]}" : "\n]}";
  return out;
}

void FlightRecorder::dumpToFile(const std::string& path) const { writeFileAtomically(path, dumpJson() + "\n"); }

std::string flightRecorderDumpPath() {
  return fmt::format("{}/cohort_flight_recorder_rank{}_pid{}.json", kRecorderDir.str(), processRankText(), ::getpid());
}

std::string dumpFlightRecorders(const std::string& reason) {
  std::string path;
  try {
    path = flightRecorderDumpPath();
    std::string rankText = processRankText();
    std::string out = fmt::format("{{\"version\": 1, \"rank\": {}, \"pid\": {}, \"reason\": ",
                                  rankText == "unknown" ? std::string("null") : rankText, ::getpid());
    appendJsonString(out, reason);
    out += fmt::format(", \"time_us\": {}, \"groups\": [", unixMicros(std::chrono::system_clock::now()));
    size_t n = 0;
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      for (const FlightRecorder* rec : r.recorders) {
        out += n++ == 0 ? "\n" : ",\n";
        out += rec->dumpJson();
      }
    }
    out += "\n]}\n";
    writeFileAtomically(path, out);
    COHORT_LOG(Warning, "flight recorder: dumped {} group(s) to {} ({})", n, path, reason);
    return path;
  } catch (const std::exception& e) {
    COHORT_LOG(Error, "flight recorder: dump for '{}' failed: {}", reason, e.what());
    return "";
  }
}

void setFlightRecorderProcessRank(int rank) { registry().processRank.store(rank); }

bool installFlightRecorderSignalHandler() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.signalTried = false;  // an explicit call tries again (the knob or the handler may have changed)
  return installLocked(r);
}

uint64_t flightRecorderSignalDumps() { return registry().signalDumps.load(); }

}  // namespace cohort::dist
