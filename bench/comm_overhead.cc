/*
 * Host-side cost of one collective call on a communicator backend (distributed/watchdog/): the
 * time ProcessGroup::allreduce takes to return — argument checks, sequence number, flight-recorder
 * entry, progress counters, the backend's translation into communicator ops, the enqueue, the
 * watchdog's bookkeeping — measured on the in-process fake communicator ("fake" backend), whose
 * enqueue is a queue push, so the figure is the layers above the communicator, which the NCCL
 * backend shares. c10d's ProcessGroupNCCL spends roughly 10-20 us per call on the host; this is
 * the number to compare (the NCCL backend adds its event records and ncclAllReduce's own launch).
 *
 *   build/bench/comm_overhead [calls] [ranks]
 *
 * Prints, for 1 and 4 elements: the issue time per call with the ops left in flight (calls issued
 * back to back, waited for at the end), and the round trip per call (issue + wait, one at a time).
 */
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <cohort/cohort.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/store/hash_store.h>

namespace {

using namespace cohort;
using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 1;
  auto store = std::make_shared<dist::HashStore>();
  std::vector<std::shared_ptr<dist::ProcessGroup>> pgs(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      dist::ProcessGroupOptions o;
      o.backend = "fake";
      o.name = "overhead";
      pgs[r] = dist::ProcessGroup::create(store, r, ranks, o);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();

  fmt::print("communicator backend host overhead: fake communicator, {} rank(s) as threads, {} calls\n", ranks, calls);
  for (int64_t n : {int64_t{1}, int64_t{1024}}) {
    std::vector<double> issue(ranks), roundTrip(ranks);
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        dist::ProcessGroup& pg = *pgs[r];
        Tensor t = zeros({n});
        for (int i = 0; i < 200; ++i) pg.allreduce(t)->wait();  // warm the ring and the pools
        std::vector<dist::WorkPtr> works;
        works.reserve(static_cast<size_t>(calls));
        Clock::duration spent{};
        for (int i = 0; i < calls; ++i) {
          const auto start = Clock::now();
          works.push_back(pg.allreduce(t));
          spent += Clock::now() - start;
        }
        for (auto& w : works) w->wait();
        issue[r] = micros(spent) / calls;
        const int trips = std::max(1, calls / 10);
        const auto start = Clock::now();
        for (int i = 0; i < trips; ++i) pg.allreduce(t)->wait();
        roundTrip[r] = micros(Clock::now() - start) / trips;
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    fmt::print("  allreduce of {:>4} float32: issue {:7.2f} us/call (launch to enqueue), round trip {:7.2f} us/call\n",
               n, *std::max_element(issue.begin(), issue.end()), *std::max_element(roundTrip.begin(), roundTrip.end()));
  }
  for (auto& pg : pgs) pg.reset();
  return 0;
}
