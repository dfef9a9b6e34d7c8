/*
 * The profiler's recording hooks: what ops, the autograd engine, the allocator and the
 * distributed layers call so that a running profiler::Profile (profiler.h) sees them. Users call
 * profiler.h; this header is for code that wants to appear in a profile.
 *
 * Cost when no profile runs: every hook starts with detail::active() (or memoryActive()), one
 * relaxed load of a process-wide flag and a branch the CPU predicts; nothing else is touched, no
 * clock is read and nothing is allocated. COHORT_RECORD_OP puts that branch at an op's entry and
 * a test of one local pointer at its exit.
 *
 * Threads: any thread may record. Each thread appends to its own buffer (owned jointly by the
 * thread and the running profile), so threads never contend with each other; the profile reads
 * the buffers when it stops or exports.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/tensor/allocator.h>
#include <cohort/core/tensor/device.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::profiler {

// What a recorded span is. The trace's "cat" and the table's grouping follow it.
enum class EventKind : uint8_t {
  Op,          // a tensor op's forward (or an op called with no grad)
  Backward,    // an autograd node's backward function
  Range,       // a user-labelled range (profiler::Range)
  Collective,  // a ProcessGroup collective, from issue to completion
  Wait,        // a thread blocked in Work::wait()
  Rpc,         // an RPC sent (from send to response) or served (the user function's run)
  Ddp,         // DDP: a gradient bucket from ready to reduced
  Fsdp,        // FSDP: a unit's parameters gathered, or freed
  Step,        // one training step (between markStep() calls)
};
const char* eventKindName(EventKind k);  // "op", "backward", "range", ...

// A named value attached to an event (the trace's "args").
struct Arg {
  std::string key;
  std::string text;  // when !isNumber
  int64_t number = 0;
  bool isNumber = false;
  static Arg num(std::string k, int64_t v) { return {std::move(k), {}, v, true}; }
  static Arg str(std::string k, std::string v) { return {std::move(k), std::move(v), 0, false}; }
};

// Links events across threads and ranks (the trace's flow arrows): the span that starts a flow
// and the spans that end it carry the same id; the id is unique within one job.
struct Flow {
  std::string id;      // e.g. "coll/world/12", "rpc/0/57"
  bool start = false;  // the arrow leaves this event (else it arrives)
};

class ThreadBuffer;

namespace detail {

extern std::atomic<bool> gActive;  // a profile is recording
extern std::atomic<bool> gMemory;  // ... and it records memory
inline bool active() { return gActive.load(std::memory_order_relaxed); }
inline bool memoryActive() { return gMemory.load(std::memory_order_relaxed); }

int64_t nowNs();  // the steady clock every event uses, in ns

// Whether the running profile records input shapes (only meaningful while active()).
bool recordShapes();

// Spans on the calling thread. beginSpan returns a handle for endSpan (-1 when not recording);
// spans nest: a span begun inside another is its child.
struct SpanHandle {
  std::shared_ptr<ThreadBuffer> buffer;
  int64_t id = -1;
};
SpanHandle beginSpan(EventKind kind, std::string_view name, uint64_t seq = 0);
void endSpan(SpanHandle& h, std::vector<Arg> args = {}, std::vector<Flow> flows = {});
// Input shapes and dtypes of the innermost open span on this thread ("[[2, 3], [3]]").
void setInputs(std::string shapes, std::string dtypes);
// The autograd node the innermost open op of this thread just made: links it to the backward.
void noteForwardSeq(uint64_t seq);

// A finished span recorded after the fact, on a named track of its own (a process group's
// collectives complete on backend threads; their track is "pg <name>").
void recordSpan(EventKind kind, std::string_view name, std::string_view track, int64_t startNs, int64_t endNs,
                std::vector<Arg> args = {}, std::vector<Flow> flows = {});

// Allocator hooks: bytes > 0 allocated, < 0 freed; the innermost open span on this thread is
// charged. onRecategorize moves live bytes between categories (setMemoryCategory).
void onMemory(const void* ptr, int64_t bytes, Device device, MemoryCategory category);
void onRecategorize(const void* ptr, int64_t bytes, Device device, MemoryCategory from, MemoryCategory to);

// Input description for COHORT_RECORD_OP: tensors and lists of tensors give their shapes and
// dtypes, other arguments (scalars, options) give an empty shape, as PyTorch's profiler does.
void describe(const Tensor& t, std::string& shapes, std::string& dtypes);
void describe(const std::vector<Tensor>& ts, std::string& shapes, std::string& dtypes);
template <typename T>
requires(!std::is_same_v<std::decay_t<T>, Tensor> &&
         !std::is_same_v<std::decay_t<T>, std::vector<Tensor>>) void describe(const T&, std::string& shapes,
                                                                              std::string& dtypes) {
  shapes += "[]";
  dtypes += "Scalar";
}

// RAII span around an op's body (COHORT_RECORD_OP), or any scope (beginKind).
class OpScope {
 public:
  OpScope() = default;
  ~OpScope() {
    if (h_.id >= 0) [[unlikely]]
      endSpan(h_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  // A span of another kind (a wait, a user range) for the scope's extent.
  void beginKind(EventKind kind, std::string_view name, uint64_t seq = 0) { h_ = beginSpan(kind, name, seq); }

  template <typename... Args>
  void begin(const char* name, const Args&... args) {
    h_ = beginSpan(EventKind::Op, name);
    if constexpr (sizeof...(Args) > 0) {
      if (h_.id >= 0 && recordShapes()) {
        std::string shapes = "[", dtypes = "[";
        bool first = true;
        auto one = [&](const auto& a) {
          if (!first) {
            shapes += ", ";
            dtypes += ", ";
          }
          first = false;
          describe(a, shapes, dtypes);
        };
        (one(args), ...);
        setInputs(shapes + "]", dtypes + "]");
      }
    }
  }

 private:
  SpanHandle h_;
};

}  // namespace detail
}  // namespace cohort::profiler

// At an op's entry: records the op's span (name, input shapes and dtypes, time, memory) while a
// profile runs; otherwise one predictable branch. The arguments after the name are the op's
// inputs as the user passed them.
#define COHORT_RECORD_OP(name, ...)                      \
  ::cohort::profiler::detail::OpScope cohortProfilerOp;  \
  if (::cohort::profiler::detail::active()) [[unlikely]] \
  cohortProfilerOp.begin(name __VA_OPT__(, ) __VA_ARGS__)
