// For the RPC example programs run without a launcher: the job's processes forked from this one,
// meeting through a FileStore in a fresh temporary directory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/rpc/agent.h>

namespace examples {

// Runs role(rank, options) for ranks 1 .. world-1 in forked children and for rank 0 here; every
// process's options carry its own handle to the shared store. Returns 0 when every role returned
// 0 (and every child exited normally), 1 otherwise.
inline int runForkedWorkers(int world, const std::function<int(int rank, cohort::rpc::RpcOptions options)>& role) {
  char tmpl[] = "/tmp/cohort_example_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  auto options = [&] {
    cohort::rpc::RpcOptions o;
    o.store = std::make_shared<cohort::dist::FileStore>(dir + "/store");
    return o;
  };
  std::vector<pid_t> pids;
  for (int rank = 1; rank < world; ++rank) {
    std::fflush(stdout);  // the child must not print the parent's buffered output again
    pid_t pid = fork();
    if (pid == 0) {
      int code = role(rank, options());
      std::fflush(stdout);
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  int code = role(0, options());
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 1;
  }
  std::filesystem::remove_all(dir);
  return code == 0 ? 0 : 1;
}

// The largest |a - b| relative to the largest |b|: how far a distributed result is from the
// single-process one.
inline double relativeDifference(const cohort::Tensor& a, const cohort::Tensor& b) {
  return a.sub(b).abs().max().itemDouble() / std::max(b.abs().max().itemDouble(), 1e-30);
}

}  // namespace examples
