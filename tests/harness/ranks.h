// Ranks as forked processes, the one harness for tests and benchmarks (bench/ includes it through
// the cohort_test_harness target):
//   - the children start together, once every fork is done (they wait on a pipe the parent then
//     closes): a child of a multi-threaded parent inherits whatever lock another parent thread
//     held at the fork, so no child's traffic may keep the parent's threads busy while it forks;
//   - each child runs body(rank, report) and exits with what it returns; an exception ends it with
//     exit code 1 and its message goes to the child's stderr (inherited, so it is visible) and to
//     its report;
//   - the parent reaps every child and kills the ones still running after `limit` (a hang is a
//     bug, never a hung test); with stopOnFailure, the first rank that fails ends the others;
//   - the result of each rank says how it ended (exit code or signal, or killed at the limit) and
//     carries what it wrote into its report.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace cohort::testing {

// A TCP port on the loopback that was free a moment ago (for a store or rendezvous the ranks of a
// test meet at).
inline uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// "exit 3", "signal 13 (Broken pipe)": how a child ended, for failure messages.
inline std::string describeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("status {}", status);
}

struct RankResult {
  int status = 0;                 // from waitpid
  bool killedByWatchdog = false;  // still running at the limit (or stopped after another failed)
  std::string report;             // what the body wrote into its report

  bool ok() const { return !killedByWatchdog && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // The exit code, or -signal for a child that was killed.
  int code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status); }
  std::string describe() const { return killedByWatchdog ? "killed at the time limit" : describeStatus(status); }
};

struct RankOptions {
  std::chrono::milliseconds limit = std::chrono::seconds(60);
  // A failed rank (not exit 0) ends the others at once, as a launcher would.
  bool stopOnFailure = false;
  // Where the reports go (report<rank>); empty: a fresh directory under TMPDIR, removed after.
  std::string reportDir;
  // Prefix of the lines the harness itself prints to stderr (a failed rank, the limit).
  std::string tag = "ranks";
};

using RankBody = std::function<int(int rank, std::ostream& report)>;

// Forks `size` ranks running body(rank, report) and waits for all of them (see the top of the file).
inline std::vector<RankResult> runRanks(int size, const RankBody& body, const RankOptions& opts = {}) {
  namespace fs = std::filesystem;
  std::string dir = opts.reportDir;
  const bool ownDir = dir.empty();
  if (ownDir) {
    std::string tmpl = (fs::temp_directory_path() / "cohort_ranks_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("runRanks: mkdtemp failed for " + tmpl);
    dir = tmpl;
  }
  auto reportPath = [&](int r) { return fmt::format("{}/report{}", dir, r); };
  int gate[2];
  if (pipe(gate) != 0) throw std::runtime_error("runRanks: pipe failed");
  std::vector<pid_t> pids(size, 0);
  for (int r = 0; r < size; ++r) {
    std::fflush(stdout);  // the child must not print the parent's buffered output again
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) {
        if (p <= 0) continue;
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
      close(gate[0]);
      close(gate[1]);
      throw std::runtime_error("runRanks: fork failed");
    }
    if (pid == 0) {
      close(gate[1]);
      char c;
      while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
      }
      close(gate[0]);
      int code = 1;
      {
        std::ofstream report(reportPath(r));
        try {
          code = body(r, report);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: rank %d: %s\n", opts.tag.c_str(), r, e.what());
          report << "uncaught: " << e.what();
          code = 1;
        } catch (...) {
          report << "uncaught exception";
          code = 1;
        }
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(code);  // no destructors of the parent's objects in the child
    }
    pids[r] = pid;
  }
  close(gate[0]);
  close(gate[1]);  // every child's read returns now

  std::vector<RankResult> results(size);
  const auto deadline = std::chrono::steady_clock::now() + opts.limit;
  int left = size;
  bool failed = false;
  while (left > 0) {
    for (int r = 0; r < size; ++r) {
      if (pids[r] == 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      results[r].status = status;
      pids[r] = 0;
      --left;
      if (!results[r].ok()) {
        failed = true;
        if (opts.stopOnFailure)
          std::fprintf(stderr, "%s: rank %d failed (%s); stopping the others\n", opts.tag.c_str(), r,
                       describeStatus(status).c_str());
      }
    }
    if (left == 0) break;
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (late || (failed && opts.stopOnFailure)) {
      if (late)
        std::fprintf(stderr, "%s: ranks still running after %lld ms; killing them\n", opts.tag.c_str(),
                     static_cast<long long>(opts.limit.count()));
      for (int r = 0; r < size; ++r) {
        if (pids[r] == 0) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &results[r].status, 0);
        results[r].killedByWatchdog = true;
        pids[r] = 0;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < size; ++r) {
    std::ifstream in(reportPath(r));
    std::stringstream ss;
    ss << in.rdbuf();
    results[r].report = ss.str();
  }
  if (ownDir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return results;
}

// "" when every rank exited 0, else one line per rank that did not, with its report.
inline std::string failedRanks(const std::vector<RankResult>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r)
    if (!results[r].ok()) out += fmt::format("rank {}: {}: {}\n", r, results[r].describe(), results[r].report);
  return out;
}

}  // namespace cohort::testing
