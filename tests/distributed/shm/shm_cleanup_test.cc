// The shm backend's names when a process is stopped from outside while it holds one it has not
// unlinked yet (its segment during setup, its buffer during allocateCommBuffer; shm_backend.h,
// "Cleanup"): a SIGTERM, SIGINT or SIGHUP removes them and still ends the process by that signal;
// the handler is only there while a name is pending and never replaces a program's own; and a
// segment that a SIGKILL left behind is removed by the next group made. Every process that sets
// up a group is a forked child of the test (this process never runs gloo, so its children may).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include <cohort/config.h>
#include <cohort/distributed/shm/shm_backend.h>
#include <cohort/distributed/store/hash_store.h>

#include "distributed/fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

#if COHORT_USE_SHM

// Forks a child that runs `body` and exits with its return value (1 on an exception).
pid_t forkChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 1;
  try {
    code = body();
  } catch (const std::exception& e) {
    fmt::print(stderr, "child: {}\n", e.what());
  }
  std::fflush(nullptr);
  _exit(code);
}

// Waits up to `limit` for `pid` to end; kills it past that. Returns its wait status.
int reap(pid_t pid, std::chrono::seconds limit = 30s) {
  auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "child " << pid << " did not end within " << limit.count() << " s";
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  return status;
}

// Waits up to 20 s until /dev/shm holds an entry containing `part` (the child reached the point
// where its name is up).
bool appears(const std::string& part) {
  auto end = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < end) {
    if (!devShmEntries(part).empty()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// A group of 2 in which only rank 0 ever comes: it creates its segment and waits for rank 1.
int setUpAlone(const std::string& group, Millis timeout) {
  auto store = std::make_shared<HashStore>(Millis(60'000));
  BackendOptions o;
  o.groupName = group;
  o.timeout = timeout;
  shm_backend::ShmBackend b(store, 0, 2, o);
  return 3;  // not reached: rank 1 never comes
}

std::string uniqueGroup(const char* what) { return fmt::format("{}{}x{}", what, getpid(), std::rand() % 100000); }

TEST(ShmCleanup, ATerminatingSignalDuringSetupRemovesTheSegmentAndStillEndsTheProcess) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string group = uniqueGroup("sig");
    pid_t child = forkChild([&] { return setUpAlone(group, Millis(60'000)); });
    ASSERT_TRUE(appears(group)) << "the child's segment never appeared";
    kill(child, sig);
    int status = reap(child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << describeStatus(status);
    EXPECT_TRUE(devShmEntries(group).empty()) << devShmEntries(group).front();
  }
}

TEST(ShmCleanup, ATerminatingSignalDuringAllocateCommBufferRemovesTheBuffer) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  const std::string group = uniqueGroup("buf");
  pid_t child = forkChild([&] {
    // Two ranks as threads set the group up; then only rank 0 asks for a buffer, and waits.
    auto store = std::make_shared<HashStore>(Millis(60'000));
    std::vector<std::shared_ptr<shm_backend::ShmBackend>> b(2);
    auto make = [&](int r) {
      BackendOptions o;
      o.groupName = group;
      o.timeout = Millis(60'000);
      b[r] = std::make_shared<shm_backend::ShmBackend>(store, r, 2, o);
    };
    std::thread t(make, 1);
    make(0);
    t.join();
    b[0]->allocateCommBuffer({4096}, DType::Float32, Millis(60'000));
    return 3;
  });
  ASSERT_TRUE(appears(group + "_0_b0")) << "the child's buffer never appeared";
  kill(child, SIGTERM);
  int status = reap(child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << describeStatus(status);
  EXPECT_TRUE(devShmEntries(group).empty()) << devShmEntries(group).front();
}

TEST(ShmCleanup, TheHandlerIsThereOnlyWhileANameIsPendingAndNeverReplacesTheProgramsOwn) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  const std::string group = uniqueGroup("disp");
  pid_t child = forkChild([&] {
    auto disposition = [](int sig) {
      struct sigaction sa {};
      sigaction(sig, nullptr, &sa);
      return sa.sa_handler;
    };
    signal(SIGHUP, SIG_IGN);  // the program's choice: stays
    if (disposition(SIGTERM) != SIG_DFL) return 10;
    std::thread setup([&] {
      try {
        setUpAlone(group, Millis(1500));  // times out: rank 1 never comes
      } catch (const DistError&) {
      }
    });
    bool seen = false;
    for (int i = 0; i < 1000 && !seen; ++i) {
      seen = !devShmEntries(group).empty();
      if (!seen) std::this_thread::sleep_for(1ms);
    }
    const bool handledWhilePending = seen && disposition(SIGTERM) != SIG_DFL && disposition(SIGINT) != SIG_DFL;
    const bool ignoredStays = disposition(SIGHUP) == SIG_IGN;
    setup.join();
    if (!seen) return 11;
    if (!handledWhilePending) return 12;
    if (!ignoredStays) return 13;
    if (disposition(SIGTERM) != SIG_DFL || disposition(SIGINT) != SIG_DFL) return 14;
    if (disposition(SIGHUP) != SIG_IGN) return 15;
    if (!devShmEntries(group).empty()) return 16;
    return 0;
  });
  int status = reap(child);
  // 10: SIGTERM was not at its default to begin with; 11: the segment never appeared; 12: no
  // handler while it was up; 13/15: SIG_IGN was replaced; 14: the default did not come back;
  // 16: the segment stayed after the timeout.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describeStatus(status);
}

TEST(ShmCleanup, ASegmentThatASigkillLeftBehindIsRemovedByTheNextGroup) {
  if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  const std::string group = uniqueGroup("kill");
  pid_t child = forkChild([&] { return setUpAlone(group, Millis(60'000)); });
  ASSERT_TRUE(appears(group)) << "the child's segment never appeared";
  // The child writes its pid into the header right after creating the segment; give it a moment.
  std::this_thread::sleep_for(100ms);
  kill(child, SIGKILL);
  int status = reap(child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << describeStatus(status);
  ASSERT_EQ(devShmEntries(group).size(), 1u) << "a SIGKILL runs no handler: the segment should still be there";
  // Any next group of this pid namespace sweeps it (a one-rank group here: no gloo, no peers).
  pid_t next = forkChild([&] {
    auto store = std::make_shared<HashStore>(Millis(60'000));
    BackendOptions o;
    o.groupName = uniqueGroup("next");
    shm_backend::ShmBackend b(store, 0, 1, o);
    return 0;
  });
  status = reap(next);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describeStatus(status);
  EXPECT_TRUE(devShmEntries(group).empty()) << devShmEntries(group).front();
}

#endif  // COHORT_USE_SHM

}  // namespace
}  // namespace cohort::dist::testing
