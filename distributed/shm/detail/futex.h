/*
 * Internal to the shm backend: sleeping on a 64-bit counter in shared memory (a futex on its low
 * half, shared between processes) and telling whether a peer's process still runs.
 */
#pragma once

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <string>

namespace cohort::dist::shm_backend::os {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the futex waits on the counter's low half");

inline uint32_t* futexWord(std::atomic<uint64_t>* counter) { return reinterpret_cast<uint32_t*>(counter); }

// Sleeps while the counter's low half is `expected`, at most `timeout` (or until woken).
inline void futexWait(std::atomic<uint64_t>* counter, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, futexWord(counter), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futexWakeAll(std::atomic<uint64_t>* counter) {
  syscall(SYS_futex, futexWord(counter), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Whether process `pid` still runs (a zombie does not: it died and waits to be reaped).
inline bool processAlive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace cohort::dist::shm_backend::os
