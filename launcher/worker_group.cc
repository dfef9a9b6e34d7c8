#include <cohort/launcher/worker_group.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include <cohort/core/util/check.h>
#include <cohort/core/util/cpu_affinity.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

namespace cohort::launcher {

COHORT_ENV_KNOB(kPath, "PATH", "/usr/local/bin:/usr/bin:/bin",
                "Where cohortrun looks for a program given without a '/' (as a shell does)");

namespace {

using Clock = std::chrono::steady_clock;

void writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // the console or a log file went away: the worker keeps running
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void childFail(int errFd, const char* what) {
  writeAll(errFd, what, std::strlen(what));
  _exit(127);
}

}  // namespace

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string WorkerExit::describe() const {
  return signaled ? fmt::format("was killed by signal {} ({})", value, signalName(value))
                  : fmt::format("exited with code {}", value);
}

std::string resolveProgram(const std::string& program) {
  namespace fs = std::filesystem;
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (!executable(program)) throw ValueError(fmt::format("cohortrun: '{}' is not an executable file", program));
    return program;
  }
  const std::string dirs = kPath.str();
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  throw ValueError(fmt::format("cohortrun: program '{}' was not found on PATH ({})", program, dirs));
}

struct WorkerGroup::Stream {
  int fd = -1;        // read end of the pipe, -1 once closed
  int consoleFd = 1;  // 1 or 2
  bool console = true;
  int fileFd = -1;
  std::string partial;
};

struct WorkerGroup::Worker {
  WorkerSpec spec;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  std::string prefix;
  std::deque<std::string> last;
};

WorkerGroup::WorkerGroup(std::string programPath, std::vector<std::string> args, LogConfig logs)
    : programPath_(std::move(programPath)), args_(std::move(args)), logs_(std::move(logs)) {}

WorkerGroup::~WorkerGroup() {
  if (numRunning() > 0) stop(0);
  for (auto& w : workers_) closeStreams(*w);
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (auto& w : workers_) out.push_back(w->pid);
  return out;
}

size_t WorkerGroup::numRunning() const {
  size_t n = 0;
  for (auto& w : workers_) n += w->running ? 1 : 0;
  return n;
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) {
  COHORT_CHECK(workers_.empty(), "a WorkerGroup starts once");
  if (!logs_.attemptDir.empty()) std::filesystem::create_directories(logs_.attemptDir);
  const pid_t parent = ::getpid();
  int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devNull < 0) throw Error(fmt::format("cohortrun: cannot open /dev/null: {}", std::strerror(errno)));
  try {
    for (const auto& spec : specs) {
      auto w = std::make_unique<Worker>();
      w->spec = spec;
      w->prefix = fmt::format("[{}]: ", spec.globalRank);
      const bool shown = !logs_.localRanksFilter ||
                         std::find(logs_.localRanksFilter->begin(), logs_.localRanksFilter->end(), spec.localRank) !=
                             logs_.localRanksFilter->end();
      const int redirected = logs_.redirects.forLocalRank(spec.localRank);
      const int teed = logs_.tee.forLocalRank(spec.localRank);
      int outPipe[2], errPipe[2];
      if (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0) {
        throw Error(fmt::format("cohortrun: pipe for rank {}: {}", spec.globalRank, std::strerror(errno)));
      }
      w->out.fd = outPipe[0];
      w->err.fd = errPipe[0];
      w->out.consoleFd = 1;
      w->err.consoleFd = 2;
      w->out.console = shown && (!(redirected & kStdout) || (teed & kStdout));
      w->err.console = shown && (!(redirected & kStderr) || (teed & kStderr));
      if (!logs_.attemptDir.empty()) {
        for (auto [s, name] : {std::pair{&w->out, "stdout"}, std::pair{&w->err, "stderr"}}) {
          std::string path = fmt::format("{}/rank_{}.{}", logs_.attemptDir, spec.globalRank, name);
          s->fileFd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
          if (s->fileFd < 0) throw Error(fmt::format("cohortrun: cannot create {}: {}", path, std::strerror(errno)));
        }
      }
      // Everything the child needs, built before the fork.
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(programPath_.c_str()));
      for (auto& a : args_) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      std::vector<char*> envp;
      for (auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
      envp.push_back(nullptr);
      const std::string execError = fmt::format("cohortrun: cannot execute {}\n", programPath_);
      const cpu_set_t cpus = spec.cpus.empty() ? cpu_set_t{} : util::cpuSet(spec.cpus);
      const std::string bindError = fmt::format("cohortrun: cannot bind rank {} to CPUs {} (--cpu-bind cores)\n",
                                                spec.globalRank, util::cpuListString(spec.cpus));

      pid_t pid = ::fork();
      if (pid < 0) throw Error(fmt::format("cohortrun: fork for rank {}: {}", spec.globalRank, std::strerror(errno)));
      if (pid == 0) {
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) _exit(127);  // the launcher died before prctl
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        if (::dup2(devNull, 0) < 0 || ::dup2(outPipe[1], 1) < 0 || ::dup2(errPipe[1], 2) < 0) _exit(127);
        ::syscall(SYS_close_range, 3U, ~0U, 0U);
        // Bound before exec: every thread the program starts inherits it.
        if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) childFail(2, bindError.c_str());
        ::execve(argv[0], argv.data(), envp.data());
        childFail(2, execError.c_str());
      }
      ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before any kill
      ::close(outPipe[1]);
      ::close(errPipe[1]);
      ::fcntl(w->out.fd, F_SETFL, O_NONBLOCK);
      ::fcntl(w->err.fd, F_SETFL, O_NONBLOCK);
      w->pid = pid;
      w->running = true;
      workers_.push_back(std::move(w));
    }
  } catch (...) {
    ::close(devNull);
    stop(0);
    throw;
  }
  ::close(devNull);
}

void WorkerGroup::pump(Worker& w, Stream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0 && errno == EAGAIN) return;
      ::close(s.fd);  // EOF (or an error): this stream is done
      s.fd = -1;
      if (!s.partial.empty()) s.partial += '\n';
    } else {
      s.partial.append(buf, static_cast<size_t>(n));
    }
    size_t start = 0, nl;
    std::string console;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
      std::string_view line(s.partial.data() + start, nl - start);
      if (s.fileFd >= 0) writeAll(s.fileFd, line.data(), line.size() + 1);
      if (s.console) {
        console += w.prefix;
        console.append(line.data(), line.size() + 1);
      }
      w.last.emplace_back(line);
      if (w.last.size() > logs_.lastLines) w.last.pop_front();
      start = nl + 1;
    }
    s.partial.erase(0, start);
    // A line longer than 1 MiB is passed on in pieces rather than held without bound.
    if (s.partial.size() > (1u << 20)) {
      if (s.fileFd >= 0) writeAll(s.fileFd, s.partial.data(), s.partial.size());
      if (s.console) console += w.prefix + s.partial + "\n";
      s.partial.clear();
    }
    if (!console.empty()) writeAll(s.consoleFd, console.data(), console.size());
  }
}

std::optional<WorkerExit> WorkerGroup::reap(Worker& w, bool block) {
  if (!w.running) return std::nullopt;
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(w.pid, &status, block ? 0 : WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got != w.pid) return std::nullopt;
  w.running = false;
  // What it wrote before exiting is in the pipes: forward it before anyone reads the summary.
  pump(w, w.out);
  pump(w, w.err);
  WorkerExit e;
  e.globalRank = w.spec.globalRank;
  e.localRank = w.spec.localRank;
  e.pid = w.pid;
  e.signaled = WIFSIGNALED(status);
  e.value = e.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  return e;
}

std::vector<WorkerExit> WorkerGroup::poll(std::chrono::milliseconds timeout, int wakeFd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (auto& w : workers_) {
    for (Stream* s : {&w->out, &w->err}) {
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(w.get(), s);
      }
    }
  }
  if (wakeFd >= 0) fds.push_back({wakeFd, POLLIN, 0});
  int rc = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (rc > 0) {
    for (size_t i = 0; i < owners.size(); ++i) {
      if (fds[i].revents != 0) pump(*owners[i].first, *owners[i].second);
    }
  }
  std::vector<WorkerExit> exits;
  for (auto& w : workers_) {
    if (auto e = reap(*w, false)) exits.push_back(*e);
  }
  return exits;
}

void WorkerGroup::signalAll(int sig) {
  for (auto& w : workers_) {
    // The whole process group, so whatever the worker started goes too; exited workers' groups
    // may still hold their children.
    if (w->pid > 0) ::kill(-w->pid, sig);
  }
}

std::vector<WorkerExit> WorkerGroup::stop(double graceSeconds) {
  std::vector<WorkerExit> exits;
  if (numRunning() > 0 && graceSeconds > 0) {
    signalAll(SIGTERM);
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(graceSeconds));
    while (numRunning() > 0 && Clock::now() < deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      for (auto& e : poll(std::min(left, std::chrono::milliseconds(20)), -1)) exits.push_back(e);
    }
  }
  signalAll(SIGKILL);
  for (auto& w : workers_) {
    if (auto e = reap(*w, true)) exits.push_back(*e);
  }
  // SIGKILL is delivered asynchronously: what a worker started may still be dying. Wait (bounded)
  // until each process group is empty, so nothing of the job outlives stop().
  auto groupsDeadline = Clock::now() + std::chrono::seconds(2);
  for (auto& w : workers_) {
    while (w->pid > 0 && ::kill(-w->pid, 0) == 0 && Clock::now() < groupsDeadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // Whatever is left in the pipes (a grandchild may hold a write end: SIGKILLed above with its group).
  for (auto& w : workers_) {
    for (Stream* s : {&w->out, &w->err}) {
      auto deadline = Clock::now() + std::chrono::milliseconds(200);
      while (s->fd >= 0 && Clock::now() < deadline) {
        pollfd p{s->fd, POLLIN, 0};
        ::poll(&p, 1, 20);
        pump(*w, *s);
      }
    }
  }
  return exits;
}

void WorkerGroup::closeStreams(Worker& w) {
  for (Stream* s : {&w.out, &w.err}) {
    if (s->fd >= 0) ::close(s->fd);
    if (s->fileFd >= 0) ::close(s->fileFd);
    s->fd = s->fileFd = -1;
  }
}

std::vector<std::string> WorkerGroup::lastLines(int globalRank) const {
  for (auto& w : workers_) {
    if (w->spec.globalRank == globalRank) return {w->last.begin(), w->last.end()};
  }
  return {};
}

}  // namespace cohort::launcher
