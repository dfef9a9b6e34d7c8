// Ranks as forked processes, for the tests where a rank dies, stalls or misbehaves: each child
// runs a body and writes a report; the process harness (tests/harness/ranks.h) reaps them all and
// kills the stragglers past a deadline, so a hang fails the test instead of blocking it. Below
// it, what the kill tests share: how an op ended on each survivor, and the verdict.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/store/store.h>

#include "distributed/store/store_test_util.h"  // TempDir
#include "harness/ranks.h"

namespace cohort::dist::testing {

// The process harness (tests/harness/ranks.h): ranks start together, a hang is killed at the
// deadline, exit codes and signals are reported.
using ChildResult = ::cohort::testing::RankResult;
using ::cohort::testing::describeStatus;

// Forks `size` children running body(rank, report) and waits for all of them, killing the
// stragglers after `deadline`. Each child writes what it saw into <dir>/report<rank>.
inline std::vector<ChildResult> runForkedIn(const std::string& dir, int size, std::chrono::seconds deadline,
                                            const std::function<int(int rank, std::ostream& report)>& body) {
  ::cohort::testing::RankOptions o;
  o.limit = deadline;
  o.reportDir = dir;
  return ::cohort::testing::runRanks(size, body, o);
}

inline std::vector<ChildResult> runForked(int size, std::chrono::seconds deadline,
                                          const std::function<int(int rank, std::ostream& report)>& body,
                                          const TempDir& dir) {
  return runForkedIn(dir.path().string(), size, deadline, body);
}

// The same, for bodies that return their report as a string (the child exits 0).
inline std::vector<ChildResult> runForked(int size, std::chrono::seconds deadline, const std::string& dir,
                                          const std::function<std::string(int rank)>& body) {
  return runForkedIn(dir, size, deadline, [&](int r, std::ostream& report) {
    report << body(r);
    return 0;
  });
}

// Whether `pid` runs (a zombie, killed but not yet reaped by its parent, does not).
inline bool processAlive(int pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' && line[close + 2] != 'X';
}

// /dev/shm entries whose name contains `part`.
inline std::vector<std::string> devShmEntries(const std::string& part) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string n = e.path().filename().string();
    if (n.find(part) != std::string::npos) out.push_back(n);
  }
  return out;
}

// Lines of /proc/self/maps (mapped regions) whose path contains `part`.
inline int mappedRegions(const std::string& part) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int count = 0;
  while (std::getline(maps, line))
    if (line.find(part) != std::string::npos) ++count;
  return count;
}

// How `fn` ended: kind "PeerError", "TimeoutError", "DistError" or "none" (it returned), the
// seconds it took and the error's message.
struct Outcome {
  std::string kind;
  double seconds = 0;
  std::string message;
};
template <typename F>
Outcome classifyOutcome(F&& fn) {
  auto start = std::chrono::steady_clock::now();
  Outcome o{"none", 0, ""};
  try {
    fn();
  } catch (const PeerError& e) {
    o.kind = "PeerError", o.message = e.what();
  } catch (const TimeoutError& e) {
    o.kind = "TimeoutError", o.message = e.what();
  } catch (const DistError& e) {
    o.kind = "DistError", o.message = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

// Kill tests: rank `dead` dies (SIGKILL, 100 ms in) inside its own call of `op`, which cannot
// finish without it; the others start `op` only once it is dead, so the test does not depend on
// scheduling, and then run `later`, which must fail at once. Returns a survivor's report for
// parseSurvivorReport ("the dead rank's op completed" if the dead rank lived).
inline std::string dieInsideOpOrReport(Store& store, int rank, int dead, const std::function<void()>& op,
                                       const std::function<void()>& later) {
  if (rank == dead) {
    store.set("dead_pid", std::to_string(getpid()));
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      raise(SIGKILL);
    }).detach();
    op();
    return "the dead rank's op completed";
  }
  const int deadPid = std::stoi(store.getString("dead_pid"));
  while (processAlive(deadPid)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Outcome first = classifyOutcome(op);
  std::string laterKind = "none";
  try {
    later();
  } catch (const DistError&) {
    laterKind = "DistError";
  }
  return fmt::format("{}|{}|{}|{}", first.kind, first.seconds, laterKind, first.message);
}

struct SurvivorReport {
  Outcome first;      // how the survivor's `op` ended
  std::string later;  // "DistError" when `later` failed, else "none"
};
inline std::optional<SurvivorReport> parseSurvivorReport(const std::string& report) {
  size_t b1 = report.find('|'), b2 = report.find('|', b1 + 1), b3 = report.find('|', b2 + 1);
  if (b1 == std::string::npos || b2 == std::string::npos || b3 == std::string::npos) return std::nullopt;
  SurvivorReport r;
  r.first.kind = report.substr(0, b1);
  r.first.seconds = std::stod(report.substr(b1 + 1, b2 - b1 - 1));
  r.later = report.substr(b2 + 1, b3 - b2 - 1);
  r.first.message = report.substr(b3 + 1);
  return r;
}

// The verdict every kill test shares: the dead rank died of SIGKILL, no rank hung, and each
// survivor's op failed with a PeerError before `timeout` (the death was noticed, not waited out)
// and its later op failed at once. Returns each survivor's report for the backend's own checks of
// the message (nullopt for the dead rank and for a report that could not be parsed).
inline std::vector<std::optional<SurvivorReport>> expectSurvivorsFailFast(const std::vector<ChildResult>& results,
                                                                          int dead, Millis timeout) {
  std::vector<std::optional<SurvivorReport>> out(results.size());
  for (size_t r = 0; r < results.size(); ++r) {
    const ChildResult& f = results[r];
    EXPECT_FALSE(f.killedByWatchdog) << "rank " << r << " hung: " << f.report;
    if (static_cast<int>(r) == dead) {
      EXPECT_TRUE(WIFSIGNALED(f.status) && WTERMSIG(f.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    out[r] = parseSurvivorReport(f.report);
    if (!out[r]) {
      ADD_FAILURE() << "rank " << r << " sent no survivor report: " << f.report;
      continue;
    }
    const Outcome& first = out[r]->first;
    std::cout << "rank " << r << " (" << first.seconds << " s): " << first.kind << ": " << first.message << "\n";
    EXPECT_EQ(first.kind, "PeerError") << first.message;
    EXPECT_LT(first.seconds, std::chrono::duration<double>(timeout).count()) << first.message;
    EXPECT_EQ(out[r]->later, "DistError") << "a later op must fail at once";
  }
  return out;
}

// A rank's report: "<error type>|<seconds>|<message>" for the op `fn` runs ("none" if it succeeded).
template <typename F>
int reportOutcome(std::ostream& report, F&& fn) {
  Outcome o = classifyOutcome(std::forward<F>(fn));
  report << o.kind << "|" << o.seconds << "|" << o.message;
  return 0;
}

inline Outcome parseOutcome(const std::string& report) {
  auto bar1 = report.find('|'), bar2 = report.find('|', bar1 + 1);
  if (bar1 == std::string::npos || bar2 == std::string::npos) return {"unreadable report: " + report, 0, ""};
  return {report.substr(0, bar1), std::stod(report.substr(bar1 + 1, bar2 - bar1 - 1)), report.substr(bar2 + 1)};
}

}  // namespace cohort::dist::testing
