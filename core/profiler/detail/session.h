/*
 * The profiler's recording state, shared by profiler.cc (recording) and the files that read what
 * was recorded (table.cc, trace.cc, memory_timeline.cc). Not installed API.
 *
 * One Session per running Profile. Each thread that records gets a ThreadBuffer registered with
 * the session; the thread appends under the buffer's own mutex (uncontended: only the profile
 * reads it, when it collects). Named tracks (a process group's collectives) are buffers too.
 */
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/profiler/profiler.h>

namespace cohort::profiler {

class ThreadBuffer {
 public:
  std::mutex mu;
  uint64_t session = 0;
  int64_t osTid = 0;
  std::string name;
  // Events by id (ids increase from 1 in start order; pruning may leave gaps).
  std::deque<Event> events;
  std::deque<int64_t> ids;
  int64_t nextId = 1;
  // Open spans, innermost last: id and the event (re-resolved after pruning).
  std::vector<std::pair<int64_t, Event*>> open;
  std::deque<MemoryEvent> memory;
  // Net bytes per category of CPU memory events dropped by the ring (to rebuild the baseline).
  CategoryBytes prunedNet;
  int64_t prunedBefore = 0;  // the ring start this buffer last pruned to
};

namespace detail {

struct Session {
  uint64_t id = 0;
  ProfileOptions opts;
  CategoryBytes baseline;  // CPU memory by category when the profile started
  int64_t startNs = 0;
  std::mutex mu;  // guards the members below
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  std::map<std::string, std::shared_ptr<ThreadBuffer>> tracks;
  std::vector<int64_t> stepBounds;  // end of each complete step
};

// Live bytes per category after memory event `m` (the caller picks the device it follows).
inline void applyMemoryEvent(CategoryBytes& live, const MemoryEvent& m) {
  switch (m.kind) {
    case MemoryEventKind::Alloc: live.bytes[static_cast<int>(m.category)] += m.bytes; break;
    case MemoryEventKind::Free: live.bytes[static_cast<int>(m.category)] -= m.bytes; break;
    case MemoryEventKind::Retag:
      live.bytes[static_cast<int>(m.from)] -= m.bytes;
      live.bytes[static_cast<int>(m.category)] += m.bytes;
      break;
  }
}

// Event ids of a buffer to positions: the position of `id`, or -1.
int64_t positionOf(const ThreadBuffer& b, int64_t id);

// Formats a byte count as PyTorch's table does ("48.00 Kb", "-4 b").
std::string formatBytes(int64_t bytes);
// Writes a whole file; Error naming `what`, the path and the system's reason on failure.
void writeTextFile(const std::string& path, const std::string& text, const char* what);
// Escapes a string for a JSON string literal (without the quotes).
void appendJsonEscaped(std::string& out, std::string_view s);

}  // namespace detail
}  // namespace cohort::profiler
