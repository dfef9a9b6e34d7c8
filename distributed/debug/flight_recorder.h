/*
 * FlightRecorder: the last N operations of one process group (op, sequence number, shapes, dtype,
 * start/end time, state, error), kept in a fixed ring so a hang or an error can be explained
 * after the fact.
 *
 * Who calls what. ProcessGroup owns one recorder per group (ProcessGroupOptions::
 * flightRecorderEntries or COHORT_FLIGHT_RECORDER_ENTRIES slots). It calls recordInPlace() when an
 * op is issued (the issuing thread, passing the time it read for the op's Work) and complete()
 * when its Work finishes or fails (a backend thread); both take one short lock and write into the
 * slot's own buffers, nothing more: the hot path never allocates once the ring is warm, formats,
 * or touches the file system. Slots keep steady-clock times; entries() and the dumps give
 * wall-clock ones. On a timeout or error the group calls
 * dumpFlightRecorders(reason), which writes every live recorder of the process to one JSON file.
 *
 * SIGUSR1. Every recorder registers itself in a process-wide registry for its lifetime. The
 * first recorder also installs a SIGUSR1 handler (unless COHORT_FLIGHT_RECORDER_SIGUSR1=0, or
 * the program already handles SIGUSR1) that only writes a byte to a self-pipe; a background
 * thread reads it and dumps, so `kill -USR1 <pid>` on a stuck rank shows what it was doing. The
 * file is $COHORT_FLIGHT_RECORDER_DIR (default /tmp)/cohort_flight_recorder_rank<R>_pid<P>.json,
 * written whole (temp file + rename), overwritten by later dumps; its path is logged.
 * After fork() the child has no dump thread until its first new recorder (or an explicit
 * installFlightRecorderSignalHandler()) starts one; until then SIGUSR1 in the child is ignored.
 *
 * Dump format (version 1):
 *   {"version": 1, "rank": 0, "pid": 123, "reason": "SIGUSR1", "time_us": <unix us>,
 *    "groups": [<recorder>...]}
 * with each <recorder> (also what FlightRecorder::dumpJson() returns):
 *   {"group": "world", "rank": 0, "capacity": 2000, "recorded": <ops ever recorded>,
 *    "entries": [{"id": 1, "seq": 1, "op": "allreduce", "shapes": "[4, 8]", "dtype": "float32",
 *                 "detail": "sum", "state": "scheduled"|"completed"|"failed",
 *                 "start_us": <unix us>, "end_us": <unix us>|null, "duration_us": <us>|null,
 *                 "error": "..."}, ...]}          (oldest first)
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <cohort/core/util/function_ref.h>
#include <cohort/distributed/collective_options.h>

namespace cohort::dist {

class FlightRecorder {
 public:
  enum class State : uint8_t { Scheduled, Completed, Failed };
  struct Entry {
    uint64_t id = 0;   // recorder-local, from 1, increasing
    uint64_t seq = 0;  // the group's sequence number (0 for send/recv)
    std::string op;
    std::string shapes;  // free text chosen by the caller, e.g. "[4, 8]; [4, 8]"
    std::string dtype;
    std::string detail;  // reduction, root, peer and tag...
    std::chrono::system_clock::time_point start{};
    std::chrono::system_clock::time_point end{};  // epoch while Scheduled
    State state = State::Scheduled;
    std::string error;
  };

  // capacity 0 disables recording (recordStart returns 0, complete(0, ...) does nothing).
  // `rank` is this process's rank in the group, shown in dumps (-1: unknown).
  FlightRecorder(std::string group, size_t capacity, int rank = -1);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Returns the entry id to pass to complete().
  uint64_t recordStart(OpType op, uint64_t seq, std::string shapes, std::string dtype = "", std::string detail = "");
  uint64_t record(uint64_t seq, std::string op, std::string shapes, std::string detail, std::string dtype = "");
  // The same for the hot path: `fill(shapes, detail)` writes the entry's text in place, under the
  // recorder's lock, into buffers reused from the ring slot (no allocation once the ring is warm).
  // `start` is when the op was issued (ProcessGroup passes the time it read for the op's Work).
  using FillFn = FunctionRef<void(std::string& shapes, std::string& detail)>;
  uint64_t recordInPlace(uint64_t seq, OpType op, FillFn fill,
                         std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  // An id that has left the ring (or 0) is ignored.
  void complete(uint64_t id, State state, std::string error = "");
  void complete(uint64_t id, bool ok, const std::string& error = "") {
    complete(id, ok ? State::Completed : State::Failed, error);
  }

  const std::string& group() const { return group_; }
  int rank() const { return rank_; }
  void setRank(int rank);
  size_t capacity() const { return capacity_; }
  uint64_t recorded() const;           // ops recorded since construction (including those overwritten)
  std::vector<Entry> entries() const;  // oldest first
  std::string dumpJson() const;
  // Writes dumpJson() to `path` (temp file + rename). Throws Error naming the path on failure.
  void dumpToFile(const std::string& path) const;

 private:
  const std::string group_;
  const size_t capacity_;
  int rank_;
  mutable std::mutex mu_;
  // A ring slot: an Entry as the hot path writes it, with the op as its enum when it has one
  // and times on the steady clock (entries() gives wall-clock times).
  struct Slot {
    uint64_t id = 0;
    uint64_t seq = 0;
    OpType opType{};
    bool opIsText = false;
    std::string opText, shapes, dtype, detail, error;
    std::chrono::steady_clock::time_point start{}, end{};
    State state = State::Scheduled;
  };
  Slot& claimSlot(uint64_t seq, std::chrono::steady_clock::time_point start, uint64_t& id);  // mu_ held
  void prefetchSlot(uint64_t id) const;  // the slot op id + 1 will use (mu_ held)
  std::vector<Slot> ring_;               // grows to capacity_, then slot (id - 1) % capacity_ is reused
  uint64_t nextId_ = 1;
};

const char* flightStateName(FlightRecorder::State s);

// ---- process-wide ----------------------------------------------------------------------------

// Writes every live recorder to the dump file (see above) and logs its path; returns the path.
// Never throws: a failure to write is logged and "" returned, so a dump never masks the error
// that caused it. Any thread (not a signal handler: SIGUSR1 goes through the dump thread).
std::string dumpFlightRecorders(const std::string& reason);
// The file dumpFlightRecorders() writes now (depends on COHORT_FLIGHT_RECORDER_DIR and the rank).
std::string flightRecorderDumpPath();
// The rank used in dump file names (initProcessGroup sets the global rank). Unset: the rank
// found in the launch environment, else "unknown".
void setFlightRecorderProcessRank(int rank);
// Installs the SIGUSR1 handler and starts the dump thread when not yet done in this process.
// Returns false (and logs why) when SIGUSR1 already has another handler or the knob disables it.
bool installFlightRecorderSignalHandler();
// Dumps completed so far by the SIGUSR1 thread (for tests and diagnostics).
uint64_t flightRecorderSignalDumps();

}  // namespace cohort::dist
