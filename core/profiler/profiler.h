/*
 * The profiler: where a job's time and memory go.
 *
 *   profiler::Profile prof({.memory = true, .shapes = true});
 *   for (...) {
 *     { profiler::Range r("data loading"); batch = next(loader); }
 *     train_step(batch);                    // Optimizer::step() marks the step boundary
 *   }
 *   prof.stop();
 *   std::cout << prof.table({.sortBy = profiler::SortBy::SelfCpuTime, .rowLimit = 15});
 *   prof.exportChromeTrace("trace.json");   // open in https://ui.perfetto.dev or chrome://tracing
 *   prof.exportMemoryTimeline("memory.html");
 *
 * While a Profile exists, every thread of the process records: each op (name, input shapes and
 * dtypes with .shapes, CPU time self and total, the thread), with .memory the bytes each op
 * allocated and freed (self: while it was the innermost span on its thread; total: with its
 * children) and every allocation and free in time order; autograd's backward functions, linked to
 * the forward op that made them (autograd sequence numbers); collectives with their group,
 * sequence number, bytes and backend; DDP buckets, FSDP gathers and frees, RPC calls sent and
 * served; user ranges; and steps. One Profile runs at a time per process (a second one is a
 * ValueError). With no Profile running, a recording hook costs one predictable branch.
 *
 * Steps: Optimizer::step() calls markStep(), and so may a loop without a cohort optimizer. With
 * .ringSteps = N only the last N steps are kept (each thread drops older events as it records),
 * so a long run's trace has a bounded size.
 *
 * Queries (events(), table(), the exports) stop the profile first if it is still running. The
 * trace is Chrome's trace event format: one process per rank, one track per thread (and one per
 * process group, where collectives complete), flows from forward ops to their backward, between
 * ranks for each collective and for each RPC; memory events as PyTorch's profiler writes them
 * ("[memory]" instant events with Addr, Bytes, Total Allocated, Total Reserved, Device Type and
 * Device Id; on a device the totals are its allocator's, a caching allocator's reserve included),
 * so tools written for PyTorch traces read cohort's. mergeTraces() joins the traces of
 * several ranks into one, on rank 0's clock (dist's job profiling does this, trace_merge.h).
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/core/profiler/record.h>

namespace cohort::profiler {

struct ProfileOptions {
  bool memory = false;    // allocations and frees: per op, and over time
  bool shapes = false;    // input shapes and dtypes of ops
  bool stack = false;     // with .memory: each allocation keeps the names of the spans open on its thread
  int64_t ringSteps = 0;  // > 0: keep only the last ringSteps steps (and the one running)
  int rank = 0;           // the trace's process id (job profiling sets the process's rank)
};

struct Event {
  EventKind kind = EventKind::Op;
  std::string name;
  int64_t startNs = 0, endNs = 0;  // detail::nowNs() clock
  uint32_t thread = 0;             // index into Profile::threads()
  int32_t depth = 0;               // 0 for a span with no enclosing span on its thread
  int64_t parent = -1;             // index into events() of the enclosing span, or -1
  std::string shapes, dtypes;      // with .shapes, for ops
  int64_t allocBytes = 0;          // self: allocated while this was the innermost span on its thread
  int64_t freedBytes = 0;          // self: freed likewise
  int64_t totalAllocBytes = 0;     // with every descendant's
  int64_t totalFreedBytes = 0;
  uint64_t seq = 0;  // autograd sequence number: of the node a forward op made, or of a backward's node
  std::vector<Arg> args;
  std::vector<Flow> flows;
  int64_t durationNs() const { return endNs - startNs; }
};

enum class MemoryEventKind : uint8_t { Alloc, Free, Retag };
struct MemoryEvent {
  MemoryEventKind kind = MemoryEventKind::Alloc;
  int64_t ns = 0;
  uint32_t thread = 0;
  uintptr_t addr = 0;
  int64_t bytes = 0;  // > 0; what was allocated, freed or re-tagged
  Device device = Device::cpu();
  MemoryCategory category = MemoryCategory::Other;  // for Retag: the new category
  MemoryCategory from = MemoryCategory::Other;      // for Retag: the old one
  // The device allocator's accounting just after an Alloc or Free: bytes handed out, and those
  // plus the freed bytes it keeps for reuse (the trace's Total Allocated / Total Reserved).
  int64_t allocatorBytes = 0;
  int64_t reservedBytes = 0;
  std::string op;     // innermost span on the thread, "" outside any
  std::string stack;  // with .stack: "forward > linear > mm"
};

struct ThreadInfo {
  int64_t osTid = 0;
  std::string name;  // the thread's name ("main" for the process's first thread), or a track name
};

enum class SortBy { SelfCpuTime, CpuTime, SelfMemory, Memory, Calls, Name };

struct TableOptions {
  SortBy sortBy = SortBy::SelfCpuTime;
  int rowLimit = 0;            // 0: every row
  bool groupByShapes = false;  // one row per (name, input shapes)
};

// One row of the table: every span with that name (and shapes) added up.
struct OpStats {
  std::string name;
  std::string shapes;  // with groupByShapes
  EventKind kind = EventKind::Op;
  int64_t calls = 0;
  int64_t selfNs = 0, totalNs = 0;
  int64_t selfMemBytes = 0, totalMemBytes = 0;  // allocated minus freed, self and total
};

struct TraceStats {
  int64_t bytes = 0;
  int64_t events = 0;
  int64_t steps = 0;         // complete steps in the trace
  int64_t bytesPerStep = 0;  // bytes / max(steps, 1)
};

// Memory over the profile: live bytes per category at each allocation or free, the peak, and what
// was live at the peak.
struct MemoryPeak {
  int64_t ns = 0;
  int64_t bytes = 0;
  CategoryBytes byCategory;
  struct Holder {
    std::string op;  // the span that allocated it ("" for memory live before the profile started)
    MemoryCategory category = MemoryCategory::Other;
    int64_t bytes = 0;
    int64_t blocks = 0;
  };
  std::vector<Holder> holders;  // largest first
};

class Profile {
 public:
  explicit Profile(ProfileOptions opts = {});
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  void stop();  // idempotent
  bool running() const { return running_; }
  const ProfileOptions& options() const { return opts_; }

  const std::vector<Event>& events();
  const std::vector<MemoryEvent>& memoryEvents();
  const std::vector<ThreadInfo>& threads();
  // Live bytes per category (CPU) when the recorded memory events begin.
  const CategoryBytes& memoryBaseline();
  int64_t steps();  // complete steps recorded

  std::vector<OpStats> keyAverages(bool groupByShapes = false);
  // PyTorch's table: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, and with
  // .memory CPU Mem and Self CPU Mem, then # of Calls (and Input Shapes when grouped by them).
  std::string table(TableOptions opts = {});

  MemoryPeak memoryPeak(DeviceType device = DeviceType::CPU);
  // A self-contained HTML page (inline SVG): live memory over the profile stacked by category,
  // the peak and what held it. ValueError without .memory.
  void exportMemoryTimeline(const std::string& path);

  // Chrome trace event JSON (see above). IoError when the file cannot be written.
  TraceStats exportChromeTrace(const std::string& path);
  // The same trace as a string, with this process's clock offset to the job's reference clock
  // (nanoseconds to subtract from every timestamp; job profiling measures it).
  std::string chromeTrace(int64_t clockOffsetNs = 0, TraceStats* stats = nullptr);

 private:
  void collect();

  ProfileOptions opts_;
  bool running_ = false;
  bool collected_ = false;
  uint64_t session_ = 0;
  std::vector<Event> events_;
  std::vector<MemoryEvent> memory_;
  std::vector<ThreadInfo> threads_;
  CategoryBytes baseline_;
  std::vector<int64_t> stepBounds_;
};

// A user-labelled range on the calling thread: a span from construction to destruction.
class Range {
 public:
  explicit Range(std::string_view name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  detail::SpanHandle h_;
};

// Marks the end of a training step (Optimizer::step() calls it). Counts even with no profile
// running, so job profiling can start at a given step.
void markStep();
int64_t stepCount();  // markStep() calls since the process started
// Called at the end of every markStep() with the new step count, on the thread that marked it (job
// profiling opens and closes its window here). One per process; nullptr removes it.
using StepListener = void (*)(int64_t step);
void setStepListener(StepListener fn);

// Joins per-rank traces (chromeTrace() strings, each with its rank and clock offset inside) into
// one: timestamps on the reference clock, collectives matched across ranks by (group, sequence
// number) with flows between them and each rank's time waiting for the last rank to arrive
// ("wait_us") versus moving data ("move_us"). ValueError naming the input that is not a trace.
std::string mergeTraces(const std::vector<std::string>& rankTraces);

}  // namespace cohort::profiler
