// Ranks as forked processes for the training benches (bench/ddp, bench/fsdp): each child meets
// the others through a FileStore in a fresh temporary directory and runs body(rank, store); the
// parent waits for all of them, and a failed rank or the deadline ends the others (a hang is a
// bug, even in a benchmark). Returns 0 when every rank exited 0.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cohort/distributed/store/file_store.h>

namespace cohort::bench {

inline int runForkedRanks(const char* tag, int world, int timeoutS, dist::Millis storeTimeout,
                          const std::function<void(int rank, const dist::StorePtr& store)>& body) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / (std::string("cohort_bench_") + tag + "_XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "%s: cannot create a temporary directory under %s\n", tag, fs::temp_directory_path().c_str());
    return 1;
  }
  const fs::path dir(tmpl);
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(dir, ec);
  };
  std::vector<pid_t> pids(world, 0);
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror(tag);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      cleanup();
      return 1;
    }
    if (pid == 0) {
      int code = 0;
      try {
        dist::StorePtr store = std::make_shared<dist::FileStore>((dir / "store").string(), storeTimeout);
        body(r, store);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d: %s\n", tag, r, e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(code);
    }
    pids[r] = pid;
  }
  int code = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] == 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      pids[r] = 0;
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "%s: rank %d failed (%s %d); stopping the others\n", tag, r,
                     WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        code = 1;
      }
    }
    if (left > 0 && (code != 0 || std::chrono::steady_clock::now() > deadline)) {
      if (code == 0) std::fprintf(stderr, "%s: ranks still running after %d s; killing them\n", tag, timeoutS);
      for (pid_t& p : pids) {
        if (p == 0) continue;
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = 0;
      }
      code = 1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  cleanup();
  return code;
}

}  // namespace cohort::bench
