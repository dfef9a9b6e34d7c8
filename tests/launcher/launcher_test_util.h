// Running cohortrun from the launcher tests: as a child process with its output in a file, with
// a deadline (a launcher that hangs fails the test instead of hanging it).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace cohort::launcher_test {

inline std::string cohortrunPath() {
  if (const char* p = std::getenv("COHORT_COHORTRUN")) return p;
  return COHORTRUN_PATH;
}
inline std::string workerPath() { return LAUNCHER_WORKER_PATH; }

inline std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh scratch directory, removed by the destructor.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct Child {
  pid_t pid = -1;
  std::string outputPath;
};

// Starts argv[0] with argv (prefix: e.g. {"ip", "netns", "exec", ns}), stdout and stderr to
// outputPath, extra "NAME=value" variables added to (or, with an empty value, removed from) the
// environment.
inline Child spawn(const std::vector<std::string>& argv, const std::string& outputPath,
                   const std::vector<std::string>& env = {}) {
  Child c;
  c.outputPath = outputPath;
  c.pid = ::fork();
  if (c.pid == 0) {
    for (const auto& kv : env) {
      auto eq = kv.find('=');
      std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
      if (value.empty()) ::unsetenv(name.c_str());
      else ::setenv(name.c_str(), value.c_str(), 1);
    }
    FILE* out = std::fopen(outputPath.c_str(), "w");
    if (!out) _exit(126);
    ::dup2(fileno(out), 1);
    ::dup2(fileno(out), 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  return c;
}

struct Result {
  bool finished = false;  // false: still running at the deadline (then killed)
  int status = 0;         // from waitpid
  std::string output;
  int exitCode() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

inline Result waitFor(Child& c, std::chrono::seconds deadline) {
  Result r;
  auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    pid_t got = ::waitpid(c.pid, &r.status, WNOHANG);
    if (got == c.pid) {
      r.finished = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!r.finished) {
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &r.status, 0);
  }
  r.output = readFile(c.outputPath);
  return r;
}

// cohortrun with `args`, its output in `dir`/cohortrun.out; OMP_NUM_THREADS unset unless env sets it.
inline Result runCohortrun(const std::vector<std::string>& args, const std::string& outputPath,
                           std::vector<std::string> env = {},
                           std::chrono::seconds deadline = std::chrono::seconds(60)) {
  std::vector<std::string> argv{cohortrunPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  env.insert(env.begin(), "OMP_NUM_THREADS=");
  Child c = spawn(argv, outputPath, env);
  return waitFor(c, deadline);
}

// Whether pid names a live process (not a zombie).
inline bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Whether pid is still alive after up to `deadline` (a SIGKILLed process dies asynchronously).
inline bool stillAliveAfter(pid_t pid, std::chrono::seconds deadline = std::chrono::seconds(5)) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (alive(pid)) {
    if (std::chrono::steady_clock::now() >= end) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Waits (bounded) for a file to exist.
inline bool waitForFile(const std::string& path, std::chrono::seconds deadline = std::chrono::seconds(30)) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace cohort::launcher_test
