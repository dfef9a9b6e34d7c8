// A world of ranks for process-group tests, behind one small interface so a test body is written
// once and runs however the ranks are made:
//   - ThreadWorld: every rank is a thread of this process, the groups meet through one HashStore
//     (optionally with a node id per rank, for the hierarchical backend);
//   - a launcher's world (tests/distributed/mpi/mpi_test.cc's MpiProcessWorld): every rank is a
//     process started by `mpirun -np N`, and this process runs only its own rank.
// run(fn) calls fn(rank) for every rank this process holds and rethrows the first failure,
// prefixed with its rank; pg(rank) is that rank's group. A body therefore may only touch
// pg(r) for the r it was given.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>

namespace cohort::testing {

class World {
 public:
  virtual ~World() = default;
  virtual int size() const = 0;
  virtual dist::ProcessGroup& pg(int rank) = 0;
  // Runs fn(rank) for each rank of this process (all of them, or only its own).
  virtual void run(const std::function<void(int)>& fn) = 0;
};

// Makes the world a suite runs on for (backend, size). Backends whose ranks cannot be threads
// register their own (mpi_test.cc: "mpi"); every other backend gets a ThreadWorld.
using WorldFactory = std::function<std::unique_ptr<World>(const std::string& backend, int size)>;
inline std::map<std::string, WorldFactory>& worldFactories() {
  static std::map<std::string, WorldFactory> factories;
  return factories;
}

// Runs fn(rank) on one thread per rank in `ranks`; rethrows the first exception (prefixed with its
// rank) once every thread has ended.
inline void runOnThreads(const std::vector<int>& ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string firstError;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (firstError.empty()) firstError = fmt::format("rank {}: {}", r, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!firstError.empty()) throw std::runtime_error(firstError);
}

// Ranks as threads: one ProcessGroup per rank over a shared HashStore.
class ThreadWorld : public World {
 public:
  ThreadWorld(const std::string& backend, int size, dist::Millis timeout = dist::Millis(30'000))
      : ThreadWorld(std::vector<std::string>(static_cast<size_t>(size)), backend, timeout) {}
  // One rank per entry of `nodes`, each with that node id ("" leaves the backend's default).
  ThreadWorld(std::vector<std::string> nodes, const std::string& backend, dist::Millis timeout = dist::Millis(30'000))
      : nodes_(std::move(nodes)), store_(std::make_shared<dist::HashStore>(dist::Millis(60'000))) {
    groups_.resize(nodes_.size());
    run([&](int r) {
      dist::ProcessGroupOptions o;
      o.backend = backend;
      o.timeout = timeout;
      o.nodeId = nodes_[r];
      groups_[r] = dist::ProcessGroup::create(store_, r, size(), o);
    });
  }
  ~ThreadWorld() override {
    // Tear down in parallel: a backend may wait for its peers while closing.
    try {
      run([&](int r) { groups_[r].reset(); });
    } catch (...) {
    }
  }
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const override { return static_cast<int>(nodes_.size()); }
  dist::ProcessGroup& pg(int r) override { return *groups_[r]; }
  const std::shared_ptr<dist::HashStore>& store() const { return store_; }

  void run(const std::function<void(int)>& fn) override {
    std::vector<int> ranks;
    for (int r = 0; r < size(); ++r) ranks.push_back(r);
    runOnThreads(ranks, fn);
  }

 private:
  std::vector<std::string> nodes_;
  std::shared_ptr<dist::HashStore> store_;
  std::vector<std::shared_ptr<dist::ProcessGroup>> groups_;
};

// The world for (backend, size): a registered factory's, else ranks as threads.
inline std::unique_ptr<World> makeWorld(const std::string& backend, int size) {
  auto it = worldFactories().find(backend);
  if (it != worldFactories().end()) return it->second(backend, size);
  return std::make_unique<ThreadWorld>(backend, size);
}

}  // namespace cohort::testing
