// The worker program the launcher tests run under cohortrun. Modes:
//   env DIR              writes its launch environment and the CPUs it may run on (cpus=) to
//                        DIR/rank_<RANK>.env, joins the group with dist::initProcessGroup() and
//                        all-reduces rank + 1
//   fail RANK CODE DIR   joins; rank RANK exits with CODE, the others write DIR/rank_<r>.pid and
//                        wait (up to 60 s) to be stopped
//   hold DIR             joins, starts a grandchild (sleep 60) in its process group, writes both
//                        pids to DIR/rank_<r>.pids and waits (up to 60 s) to be stopped
//   crash-once RANK MARKER DIR  joins; without MARKER, rank RANK creates it and kills itself
//                        (SIGKILL) while the others wait; with MARKER every rank all-reduces and
//                        writes DIR/rank_<r>.done with its restart count
//   train STEPS EVERY CKPT_DIR OUT_DIR [DIE_RANK DIE_STEP MARKER]
//                        train_math.h's training; rank 0 checkpoints every EVERY steps; every
//                        rank resumes from the checkpoint, writes the step it started at and
//                        its final state; DIE_RANK kills itself at the start of DIE_STEP once.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/cpu_affinity.h>
#include <cohort/distributed/init.h>

#include "launcher/train_math.h"

using namespace cohort;
using namespace cohort::launcher_test;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void writeFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

void waitToBeStopped() {
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::cerr << "launcher_worker: nobody stopped me within 60 s\n";
  std::exit(3);
}

int64_t allreduceRankPlusOne(dist::ProcessGroup& pg) {
  Tensor t = full({1}, pg.rank() + 1, TensorOptions{.dtype = DType::Int64});
  pg.allreduce(t)->wait();
  return t.data<int64_t>()[0];
}

int train(int argc, char** argv, dist::ProcessGroup& pg) {
  const int steps = std::atoi(argv[2]), every = std::atoi(argv[3]);
  const std::string ckpt = std::string(argv[4]) + "/ckpt.txt", out = argv[5];
  const int dieRank = argc > 8 ? std::atoi(argv[6]) : -1, dieStep = argc > 8 ? std::atoi(argv[7]) : -1;
  const std::string marker = argc > 8 ? argv[8] : "";
  State w = initialState();
  int start = 1;
  if (exists(ckpt)) {
    std::ifstream f(ckpt);
    int done = 0;
    f >> done;
    for (auto& v : w) f >> v;
    start = done + 1;
  }
  const std::string attempt = env("COHORT_RESTART_COUNT");
  writeFile(out + "/rank_" + std::to_string(pg.rank()) + ".attempt_" + attempt + ".start", std::to_string(start));
  std::cout << "training from step " << start << " to " << steps << " (attempt " << attempt << ")" << std::endl;
  for (int s = start; s <= steps; ++s) {
    if (pg.rank() == dieRank && s == dieStep && !exists(marker)) {
      writeFile(marker, "died");
      std::cout << "killing myself at step " << s << std::endl;
      ::kill(::getpid(), SIGKILL);
    }
    Tensor g = empty({kStateSize}, TensorOptions{.dtype = DType::Int64});
    for (int i = 0; i < kStateSize; ++i) g.data<int64_t>()[i] = localGrad(w, i, pg.rank(), s);
    pg.allreduce(g)->wait();
    State summed{};
    for (int i = 0; i < kStateSize; ++i) summed[i] = g.data<int64_t>()[i];
    applyUpdate(w, summed);
    if (pg.rank() == 0 && s % every == 0) {
      std::ostringstream c;
      c << s;
      for (auto v : w) c << ' ' << v;
      writeFile(ckpt, c.str());
    }
  }
  std::ostringstream r;
  for (auto v : w) r << v << ' ';
  writeFile(out + "/rank_" + std::to_string(pg.rank()) + ".result", r.str());
  std::cout << "finished" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: launcher_worker env|fail|hold|crash-once|train ...\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "env") {
      std::ostringstream e;
      for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                            "MASTER_ADDR", "MASTER_PORT", "COHORT_RUN_ID", "COHORT_RESTART_COUNT",
                            "COHORT_MAX_RESTARTS", "COHORT_STORE_HOSTED_BY_LAUNCHER", "OMP_NUM_THREADS"}) {
        e << k << '=' << env(k) << '\n';
      }
      e << "cpus=" << util::cpuListString(util::allowedCpus()) << '\n';
      auto pg = dist::initProcessGroup();
      e << "allreduce=" << allreduceRankPlusOne(*pg) << '\n';
      writeFile(std::string(argv[2]) + "/rank_" + env("RANK") + ".env", e.str());
      std::cout << "hello from rank " << pg->rank() << " of " << pg->size() << std::endl;
      return 0;
    }
    auto pg = dist::initProcessGroup();
    if (mode == "fail") {
      if (pg->rank() == std::atoi(argv[2])) {
        // Fail once every other rank has said who it is, so the test can check they were stopped.
        for (int r = 0; r < pg->size(); ++r) {
          const std::string f = std::string(argv[4]) + "/rank_" + std::to_string(r) + ".pid";
          for (int i = 0; r != pg->rank() && !exists(f) && i < 3000; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }
        std::cerr << "rank " << pg->rank() << " failing on purpose with code " << argv[3] << std::endl;
        return std::atoi(argv[3]);
      }
      writeFile(std::string(argv[4]) + "/rank_" + std::to_string(pg->rank()) + ".pid", std::to_string(::getpid()));
      waitToBeStopped();
    }
    if (mode == "hold") {
      pid_t child = ::fork();
      if (child == 0) {
        ::execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
        _exit(127);
      }
      writeFile(std::string(argv[2]) + "/rank_" + std::to_string(pg->rank()) + ".pids",
                std::to_string(::getpid()) + " " + std::to_string(child));
      waitToBeStopped();
    }
    if (mode == "crash-once") {
      const std::string marker = argv[3];
      if (!exists(marker)) {
        if (pg->rank() == std::atoi(argv[2])) {
          writeFile(marker, "crashed");
          std::cout << "crashing once" << std::endl;
          ::kill(::getpid(), SIGKILL);
        }
        waitToBeStopped();
      }
      int64_t sum = allreduceRankPlusOne(*pg);
      writeFile(std::string(argv[4]) + "/rank_" + std::to_string(pg->rank()) + ".done",
                "restart=" + env("COHORT_RESTART_COUNT") + " allreduce=" + std::to_string(sum));
      return 0;
    }
    if (mode == "train") return train(argc, argv, *pg);
  } catch (const std::exception& e) {
    std::cerr << "launcher_worker: " << e.what() << std::endl;
    return 1;
  }
  std::cerr << "launcher_worker: unknown mode " << mode << "\n";
  return 2;
}
