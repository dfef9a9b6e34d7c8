// Recording: sessions, per-thread buffers, the hooks of record.h, steps, and collecting what the
// buffers hold into a Profile's events.
#include <cohort/core/profiler/profiler.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <unordered_map>

#include <cohort/core/profiler/detail/session.h>
#include <cohort/core/util/check.h>

namespace cohort::profiler {

const char* eventKindName(EventKind k) {
  switch (k) {
    case EventKind::Op: return "op";
    case EventKind::Backward: return "backward";
    case EventKind::Range: return "range";
    case EventKind::Collective: return "collective";
    case EventKind::Wait: return "wait";
    case EventKind::Rpc: return "rpc";
    case EventKind::Ddp: return "ddp";
    case EventKind::Fsdp: return "fsdp";
    case EventKind::Step: return "step";
  }
  return "?";
}

namespace detail {

std::atomic<bool> gActive{false};
std::atomic<bool> gMemory{false};

namespace {

std::mutex gMu;  // guards gSession
std::shared_ptr<Session> gSession;
std::atomic<uint64_t> gSessionId{0};
std::atomic<int64_t> gRingStartNs{INT64_MIN};
std::atomic<bool> gShapes{false};
std::atomic<bool> gStack{false};
std::atomic<int64_t> gSteps{0};
std::atomic<int64_t> gLastStepNs{0};
std::atomic<StepListener> gStepListener{nullptr};

thread_local std::shared_ptr<ThreadBuffer> tlsBuffer;

int64_t osThreadId() { return static_cast<int64_t>(::syscall(SYS_gettid)); }

std::string threadName(int64_t tid) {
  if (tid == static_cast<int64_t>(::getpid())) return "main";
  char name[32] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 || name[0] == '\0') return "thread";
  return name;
}

std::shared_ptr<Session> currentSession() {
  std::lock_guard<std::mutex> lock(gMu);
  return gSession;
}

// This thread's buffer in the running session (registered on first use), or null.
ThreadBuffer* buffer() {
  const uint64_t id = gSessionId.load(std::memory_order_acquire);
  if (tlsBuffer && tlsBuffer->session == id) [[likely]]
    return tlsBuffer.get();
  std::shared_ptr<Session> s = currentSession();
  if (!s) return nullptr;
  auto b = std::make_shared<ThreadBuffer>();
  b->session = s->id;
  b->osTid = osThreadId();
  b->name = threadName(b->osTid);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->buffers.push_back(b);
  }
  tlsBuffer = std::move(b);
  return tlsBuffer.get();
}

// Drops what the ring no longer keeps: closed spans that ended before the ring's start and memory
// events before it (their net bytes go into prunedNet, so the baseline stays right). The owning
// thread calls it with the buffer's lock held.
void prune(ThreadBuffer& b) {
  const int64_t ringStart = gRingStartNs.load(std::memory_order_relaxed);
  if (ringStart <= b.prunedBefore) return;
  b.prunedBefore = ringStart;
  std::deque<Event> keptEvents;
  std::deque<int64_t> keptIds;
  for (size_t i = 0; i < b.events.size(); ++i) {
    const Event& e = b.events[i];
    bool open = e.endNs == 0;
    if (!open && e.endNs < ringStart) continue;
    keptEvents.push_back(std::move(b.events[i]));
    keptIds.push_back(b.ids[i]);
  }
  b.events = std::move(keptEvents);
  b.ids = std::move(keptIds);
  for (auto& [id, ptr] : b.open) ptr = &b.events[static_cast<size_t>(positionOf(b, id))];
  while (!b.memory.empty() && b.memory.front().ns < ringStart) {
    const MemoryEvent& m = b.memory.front();
    if (m.device.type() == DeviceType::CPU) applyMemoryEvent(b.prunedNet, m);
    b.memory.pop_front();
  }
}

Event& push(ThreadBuffer& b, EventKind kind, std::string_view name, int64_t start, int64_t& idOut) {
  prune(b);
  b.events.emplace_back();
  Event& e = b.events.back();
  e.kind = kind;
  e.name = std::string(name);
  e.startNs = start;
  idOut = b.nextId++;
  b.ids.push_back(idOut);
  return e;
}

}  // namespace

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool recordShapes() { return gShapes.load(std::memory_order_relaxed); }

int64_t positionOf(const ThreadBuffer& b, int64_t id) {
  auto it = std::lower_bound(b.ids.begin(), b.ids.end(), id);
  if (it == b.ids.end() || *it != id) return -1;
  return it - b.ids.begin();
}

SpanHandle beginSpan(EventKind kind, std::string_view name, uint64_t seq) {
  if (!active()) return {};
  ThreadBuffer* b = buffer();
  if (b == nullptr) return {};
  std::lock_guard<std::mutex> lock(b->mu);
  // An op that re-enters itself (autocast calls the op again with its arguments cast) is one span.
  if (kind == EventKind::Op && !b->open.empty() && b->open.back().second->kind == EventKind::Op &&
      b->open.back().second->name == name)
    return {};
  int64_t id = 0;
  Event& e = push(*b, kind, name, nowNs(), id);
  e.seq = seq;
  e.depth = static_cast<int32_t>(b->open.size());
  e.parent = b->open.empty() ? -1 : b->open.back().first;
  b->open.emplace_back(id, &e);
  return {tlsBuffer, id};
}

void endSpan(SpanHandle& h, std::vector<Arg> args, std::vector<Flow> flows) {
  if (h.id < 0 || !h.buffer) return;
  const int64_t end = nowNs();
  ThreadBuffer& b = *h.buffer;
  std::lock_guard<std::mutex> lock(b.mu);
  // Spans end innermost first; one whose inner span never ended (an exception unwound past a
  // handle that was moved away) closes that one too.
  while (!b.open.empty()) {
    auto [id, e] = b.open.back();
    b.open.pop_back();
    e->endNs = std::max(end, e->startNs + 1);
    if (id == h.id) {
      for (Arg& a : args) e->args.push_back(std::move(a));
      for (Flow& f : flows) e->flows.push_back(std::move(f));
      break;
    }
  }
  h.id = -1;
  h.buffer.reset();
}

void setInputs(std::string shapes, std::string dtypes) {
  ThreadBuffer* b = tlsBuffer.get();
  if (b == nullptr) return;
  std::lock_guard<std::mutex> lock(b->mu);
  if (b->open.empty()) return;
  b->open.back().second->shapes = std::move(shapes);
  b->open.back().second->dtypes = std::move(dtypes);
}

void noteForwardSeq(uint64_t seq) {
  if (!active()) return;
  ThreadBuffer* b = tlsBuffer.get();
  if (b == nullptr || b->session != gSessionId.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(b->mu);
  // The innermost open op: a composite op's nodes belong to the op that made them.
  for (auto it = b->open.rbegin(); it != b->open.rend(); ++it)
    if (it->second->kind == EventKind::Op) {
      if (it->second->seq == 0) it->second->seq = seq;
      return;
    }
}

void recordSpan(EventKind kind, std::string_view name, std::string_view track, int64_t startNs, int64_t endNs,
                std::vector<Arg> args, std::vector<Flow> flows) {
  if (!active()) return;
  std::shared_ptr<Session> s = currentSession();
  if (!s) return;
  std::shared_ptr<ThreadBuffer> b;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    auto& slot = s->tracks[std::string(track)];
    if (!slot) {
      slot = std::make_shared<ThreadBuffer>();
      slot->session = s->id;
      slot->name = std::string(track);
    }
    b = slot;
  }
  std::lock_guard<std::mutex> lock(b->mu);
  int64_t id = 0;
  Event& e = push(*b, kind, name, startNs, id);
  e.endNs = std::max(endNs, startNs + 1);
  e.args = std::move(args);
  e.flows = std::move(flows);
}

namespace {
void pushMemory(MemoryEvent m) {
  ThreadBuffer* b = buffer();
  if (b == nullptr) return;
  std::lock_guard<std::mutex> lock(b->mu);
  prune(*b);
  m.ns = nowNs();
  if (!b->open.empty()) {
    Event* top = b->open.back().second;
    if (m.kind == MemoryEventKind::Alloc) top->allocBytes += m.bytes;
    if (m.kind == MemoryEventKind::Free) top->freedBytes += m.bytes;
    m.op = top->name;
    if (gStack.load(std::memory_order_relaxed)) {
      for (const auto& [id, e] : b->open) {
        if (!m.stack.empty()) m.stack += " > ";
        m.stack += e->name;
      }
    }
  }
  b->memory.push_back(std::move(m));
}
}  // namespace

void onMemory(const void* ptr, int64_t bytes, Device device, MemoryCategory category) {
  if (!memoryActive() || bytes == 0) return;
  MemoryEvent m;
  m.kind = bytes > 0 ? MemoryEventKind::Alloc : MemoryEventKind::Free;
  m.addr = reinterpret_cast<uintptr_t>(ptr);
  m.bytes = bytes > 0 ? bytes : -bytes;
  m.device = device;
  m.category = m.from = category;
  const AllocatorStats st = memoryStats(device);
  m.allocatorBytes = st.bytesLive;
  m.reservedBytes = st.bytesLive + st.cachedBytes;
  pushMemory(std::move(m));
}

void onRecategorize(const void* ptr, int64_t bytes, Device device, MemoryCategory from, MemoryCategory to) {
  if (!memoryActive() || bytes == 0) return;
  MemoryEvent m;
  m.kind = MemoryEventKind::Retag;
  m.addr = reinterpret_cast<uintptr_t>(ptr);
  m.bytes = bytes;
  m.device = device;
  m.category = to;
  m.from = from;
  pushMemory(std::move(m));
}

void describe(const Tensor& t, std::string& shapes, std::string& dtypes) {
  if (!t.defined()) {
    shapes += "[]";
    dtypes += "undefined";
    return;
  }
  shapes += shapeStr(t.sizes());
  dtypes += dtypeName(t.dtype());
}

void describe(const std::vector<Tensor>& ts, std::string& shapes, std::string& dtypes) {
  shapes += "[";
  dtypes += "TensorList";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i > 0) shapes += ", ";
    shapes += ts[i].defined() ? shapeStr(ts[i].sizes()) : "[]";
  }
  shapes += "]";
}

}  // namespace detail

// ---- Steps ----

namespace {
void recordStep(int64_t n, int64_t prev, int64_t now);
}  // namespace

void markStep() {
  const int64_t now = detail::nowNs();
  const int64_t n = detail::gSteps.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t prev = detail::gLastStepNs.exchange(now, std::memory_order_relaxed);
  StepListener listener = detail::gStepListener.load(std::memory_order_acquire);
  if (detail::active()) [[unlikely]]
    recordStep(n, prev, now);
  if (listener != nullptr) listener(n);
}

void setStepListener(StepListener fn) { detail::gStepListener.store(fn, std::memory_order_release); }

namespace {
void recordStep(int64_t n, int64_t prev, int64_t now) {
  std::shared_ptr<detail::Session> s = detail::currentSession();
  if (!s) return;
  int64_t start = std::max(prev, s->startNs);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stepBounds.push_back(now);
    const int64_t ring = s->opts.ringSteps;
    if (ring > 0 && static_cast<int64_t>(s->stepBounds.size()) > ring)
      detail::gRingStartNs.store(s->stepBounds[s->stepBounds.size() - 1 - static_cast<size_t>(ring)],
                                 std::memory_order_relaxed);
  }
  // On a track of its own: a step is recorded when it ends, and spans still open then (a range
  // around the whole loop) would not nest with it on the thread's track.
  detail::recordSpan(EventKind::Step, "ProfilerStep#" + std::to_string(n), "steps", start, now);
}
}  // namespace

int64_t stepCount() { return detail::gSteps.load(std::memory_order_relaxed); }

// ---- Range ----

Range::Range(std::string_view name) {
  if (detail::active()) [[unlikely]]
    h_ = detail::beginSpan(EventKind::Range, name);
}
Range::~Range() {
  if (h_.id >= 0) detail::endSpan(h_);
}

// ---- Profile ----

Profile::Profile(ProfileOptions opts) : opts_(opts) {
  if (opts_.ringSteps < 0) throw ValueError(fmt::format("Profile: ringSteps must be >= 0, got {}", opts_.ringSteps));
  if (opts_.stack && !opts_.memory)
    throw ValueError("Profile: .stack records allocation stacks and needs .memory = true");
  auto s = std::make_shared<detail::Session>();
  s->opts = opts_;
  s->baseline = memoryByCategory(DeviceType::CPU);
  s->startNs = detail::nowNs();
  {
    std::lock_guard<std::mutex> lock(detail::gMu);
    if (detail::gSession)
      throw ValueError("Profile: another profile is already running in this process; stop it first (one at a time)");
    s->id = detail::gSessionId.load() + 1;
    session_ = s->id;
    detail::gSession = s;
    detail::gRingStartNs.store(INT64_MIN, std::memory_order_relaxed);
    detail::gShapes.store(opts_.shapes, std::memory_order_relaxed);
    detail::gStack.store(opts_.stack, std::memory_order_relaxed);
    detail::gSessionId.store(s->id, std::memory_order_release);
    detail::gMemory.store(opts_.memory, std::memory_order_relaxed);
    detail::gActive.store(true, std::memory_order_release);
  }
  detail::gLastStepNs.store(s->startNs, std::memory_order_relaxed);
  running_ = true;
}

Profile::~Profile() { stop(); }

void Profile::stop() {
  if (!running_) return;
  running_ = false;
  collect();
}

void Profile::collect() {
  std::shared_ptr<detail::Session> s;
  const int64_t stopNs = detail::nowNs();
  {
    std::lock_guard<std::mutex> lock(detail::gMu);
    if (detail::gSession && detail::gSession->id == session_) {
      s = detail::gSession;
      detail::gActive.store(false, std::memory_order_release);
      detail::gMemory.store(false, std::memory_order_relaxed);
      detail::gSession.reset();
    }
  }
  collected_ = true;
  if (!s) return;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    buffers = s->buffers;
    for (auto& [name, b] : s->tracks) buffers.push_back(b);
    stepBounds_ = s->stepBounds;
  }
  const int64_t ringStart = detail::gRingStartNs.load(std::memory_order_relaxed);
  baseline_ = s->baseline;
  for (uint32_t t = 0; t < buffers.size(); ++t) {
    ThreadBuffer& b = *buffers[t];
    std::lock_guard<std::mutex> lock(b.mu);
    threads_.push_back({b.osTid, b.name});
    for (int c = 0; c < kNumMemoryCategories; ++c) baseline_.bytes[c] += b.prunedNet.bytes[c];
    std::unordered_map<int64_t, int64_t> index;  // buffer id -> index in events_
    const size_t first = events_.size();
    for (size_t i = 0; i < b.events.size(); ++i) {
      Event e = b.events[i];
      if (e.endNs == 0) e.endNs = std::max(stopNs, e.startNs + 1);  // still open: ends at stop
      if (ringStart != INT64_MIN && e.endNs < ringStart) continue;
      e.thread = t;
      index[b.ids[i]] = static_cast<int64_t>(events_.size());
      events_.push_back(std::move(e));
    }
    for (size_t i = first; i < events_.size(); ++i) {
      Event& e = events_[i];
      auto it = e.parent >= 0 ? index.find(e.parent) : index.end();
      e.parent = it == index.end() ? -1 : it->second;
    }
    for (const MemoryEvent& m : b.memory) {
      if (ringStart != INT64_MIN && m.ns < ringStart) {
        if (m.device.type() == DeviceType::CPU) detail::applyMemoryEvent(baseline_, m);
        continue;
      }
      memory_.push_back(m);
      memory_.back().thread = t;
    }
  }
  // Totals: a span's own bytes plus its children's (children come after their parent).
  for (Event& e : events_) {
    e.totalAllocBytes = e.allocBytes;
    e.totalFreedBytes = e.freedBytes;
  }
  for (size_t i = events_.size(); i-- > 0;) {
    const Event& e = events_[i];
    if (e.parent >= 0) {
      events_[static_cast<size_t>(e.parent)].totalAllocBytes += e.totalAllocBytes;
      events_[static_cast<size_t>(e.parent)].totalFreedBytes += e.totalFreedBytes;
    }
  }
  std::stable_sort(memory_.begin(), memory_.end(),
                   [](const MemoryEvent& a, const MemoryEvent& b) { return a.ns < b.ns; });
  if (ringStart != INT64_MIN)
    stepBounds_.erase(std::remove_if(stepBounds_.begin(), stepBounds_.end(), [&](int64_t t) { return t <= ringStart; }),
                      stepBounds_.end());
}

const std::vector<Event>& Profile::events() {
  stop();
  return events_;
}
const std::vector<MemoryEvent>& Profile::memoryEvents() {
  stop();
  return memory_;
}
const std::vector<ThreadInfo>& Profile::threads() {
  stop();
  return threads_;
}
const CategoryBytes& Profile::memoryBaseline() {
  stop();
  return baseline_;
}
int64_t Profile::steps() {
  stop();
  return static_cast<int64_t>(stepBounds_.size());
}

}  // namespace cohort::profiler
