// ProcessGroup behaviour that does not depend on the backend's transport: argument validation,
// the uniform unsupported-op error, the backend registry, device routing, Work and its timeout
// diagnosis, the flight recorder. Uses gloo where a real backend is needed (skipped without it).
#include <type_traits>

#include "distributed/pg_test_util.h"

#include "distributed/env_guard.h"

#include <cohort/distributed/debug/flight_recorder.h>

namespace cohort::dist::testing {
namespace {

// Only backends complete Works: outside Backend (and ProcessGroup) the key to finish/fail cannot
// be made, not even by brace-initialisation.
template <typename T>
concept BraceInitialisable = requires {
  T{};
};
template <typename W>
concept FinishableWithoutKey = requires(W& w) {
  w.finish(std::vector<Tensor>{});
};
template <typename W>
concept FailableWithoutKey = requires(W& w) {
  w.fail(std::exception_ptr{});
};
static_assert(!std::is_default_constructible_v<Work::CompletionKey>);
static_assert(!BraceInitialisable<Work::CompletionKey>);
static_assert(!FinishableWithoutKey<Work> && !FailableWithoutKey<Work>);
static_assert(requires(Work & w, Work::CompletionKey key) { w.finish(key, std::vector<Tensor>{}); });  // with it

// A backend that only knows allreduce (it adds 1 to every element, without talking to anyone),
// to test routing, supports() and the uniform error of the ops it lacks.
class AllreduceOnlyBackend : public Backend {
 public:
  AllreduceOnlyBackend(int rank, int size) : Backend("allreduce_only", rank, size) {}
  bool supports(OpType op) const override { return op == OpType::Allreduce; }
  void allreduce(Tensor& t, const AllreduceOptions&, const WorkPtr& work) override {
    t.add_(Scalar(1));
    work->finish(completionKey(), {t});
  }
};

const bool kRegistered = [] {
  registerBackend("allreduce_only", [](const StorePtr&, int rank, int size, const BackendOptions&) -> BackendPtr {
    return std::make_shared<AllreduceOnlyBackend>(rank, size);
  });
  return true;
}();

template <typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::shared_ptr<ProcessGroup> soloGroup(const std::string& backend, ProcessGroupOptions o = {}) {
  o.backend = backend;
  return ProcessGroup::create(std::make_shared<HashStore>(), 0, 1, o);
}

TEST(BackendRegistry, UnknownBackendListsTheAvailableOnes) {
  EXPECT_TRUE(hasBackend("allreduce_only"));
  auto names = availableBackends();
  EXPECT_NE(std::find(names.begin(), names.end(), "allreduce_only"), names.end());
  std::string msg = errorOf([] { soloGroup("carrier_pigeon"); });
  EXPECT_NE(msg.find("no collective backend named 'carrier_pigeon'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allreduce_only"), std::string::npos) << msg;
  EXPECT_THROW(soloGroup("carrier_pigeon"), NotSupportedError);
}

TEST(BackendRegistry, UnsupportedOpsFailUniformlyAndSupportsAnswersInAdvance) {
  auto pg = soloGroup("allreduce_only");
  EXPECT_TRUE(pg->supports(OpType::Allreduce));
  EXPECT_FALSE(pg->supports(OpType::Broadcast));
  EXPECT_FALSE(pg->supports(OpType::Allreduce, DeviceType::CUDA));
  Tensor t = zeros({3});
  pg->allreduce(t)->wait();
  EXPECT_EQ(t.toVector<float>(), (std::vector<float>{1, 1, 1}));
  uint64_t seq = pg->sequenceNumber();
  EXPECT_EQ(errorOf([&] { pg->broadcast(t); }), "backend allreduce_only does not support broadcast");
  EXPECT_THROW(pg->barrier(), NotSupportedError);
  EXPECT_EQ(pg->sequenceNumber(), seq) << "an op refused up front must not take a sequence number";
  // The base class's default for each op says the same.
  AllreduceOnlyBackend b(0, 1);
  auto work = std::make_shared<Work>(OpType::Gather, 1, "g", Millis(1000));
  std::vector<Tensor> outs;
  EXPECT_EQ(errorOf([&] { b.gather(outs, t, {}, work); }), "backend allreduce_only does not support gather");
  AlltoallOptions uneven;
  uneven.inputSplitSizes = {3};
  EXPECT_EQ(errorOf([&] { b.alltoall(t, t, uneven, work); }), "backend allreduce_only does not support alltoall_v");
}

TEST(ProcessGroupValidation, BadArgumentsNameTheOpGroupAndShapes) {
  auto pg = soloGroup("allreduce_only", {.name = "trainers"});
  Tensor a = zeros({2, 3});
  std::string msg = errorOf([&] {
    Tensor nc = a.t();
    pg->allreduce(nc);
  });
  EXPECT_NE(msg.find("allreduce in group 'trainers'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  Tensor transposed = a.t();
  EXPECT_THROW(pg->allreduce(transposed), ValueError);

  Tensor ints = zeros({4}, TensorOptions{.dtype = DType::Int32});
  msg = errorOf([&] { pg->allreduce(ints, {.op = ReduceOp::Avg}); });
  EXPECT_NE(msg.find("avg needs a floating-point tensor, got int32"), std::string::npos) << msg;

  Tensor undefined;
  EXPECT_NE(errorOf([&] { pg->allreduce(undefined); }).find("tensor is undefined"), std::string::npos);
}

TEST(ProcessGroupValidation, EveryCollectiveChecksItsShapes) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  ThreadWorld world("gloo", 2);
  world.run([&](int r) {
    auto& pg = world.pg(r);
    Tensor in = zeros({4});
    auto expectValueError = [&](auto&& f, const std::string& needle) {
      std::string msg;
      try {
        f();
        msg = "(no error)";
      } catch (const ValueError& e) {
        msg = e.what();
      }
      EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
      EXPECT_NE(msg.find("in group 'world'"), std::string::npos) << msg;
    };
    std::vector<Tensor> one = {zeros({4})};
    expectValueError([&] { pg.allgather(one, in); },
                     "allgather in group 'world': expected 2 output tensors (one per rank), got 1");
    std::vector<Tensor> wrongDtype = {zeros({4}), zeros({4}, TensorOptions{.dtype = DType::Float64})};
    expectValueError([&] { pg.allgather(wrongDtype, in); }, "output 1 is float64 [4], but the input is float32 [4]");
    Tensor big = zeros({9});
    expectValueError([&] { pg.allgatherIntoTensor(big, in); }, "must hold 2 x input [4] = 8 elements, has 9");
    expectValueError([&] { pg.broadcast(in, {.root = 2}); },
                     "broadcast in group 'world': root 2 is out of range for a group of size 2");
    expectValueError([&] { pg.reduce(in, {.root = -1}); }, "root -1 is out of range");
    std::vector<Tensor> rsIn = {zeros({4}), zeros({5})};
    expectValueError([&] { pg.reduceScatter(in, rsIn); }, "input 1 is float32 [5], but the output is float32 [4]");
    Tensor odd = zeros({3, 2});
    Tensor odd2 = zeros({3, 2});
    expectValueError([&] { pg.alltoall(odd2, odd); }, "has 3 rows along dim 0, not divisible by the group size 2");
    AlltoallOptions splits;
    splits.inputSplitSizes = {1, 1};
    splits.outputSplitSizes = {2, 1};
    expectValueError([&] { pg.alltoall(odd2, odd, splits); },
                     "input split sizes [1, 1] add up to 2, but dim 0 has 3 rows");
    std::vector<Tensor> listIn = {zeros({2}), zeros({1})};
    std::vector<Tensor> listOut = {zeros({2}), zeros({1})};
    expectValueError([&] { pg.alltoallList(listOut, listIn, splits); },
                     "alltoall_list in group 'world': split sizes apply to alltoall on one tensor");
    expectValueError([&] { pg.send(in, r); }, "cannot send to itself");
    expectValueError([&] { pg.recv(in, 5); }, "source rank 5 is out of range");
    expectValueError([&] { pg.send(in, 1 - r, {.tag = -2}); }, "tag must be non-negative");
    std::vector<Tensor> none;
    expectValueError([&] { pg.allreduceCoalesced(none); }, "needs at least one tensor");
    std::vector<Tensor> mixed = {zeros({2}), zeros({2}, TensorOptions{.dtype = DType::Int64})};
    expectValueError([&] { pg.allreduceCoalesced(mixed); }, "tensor 1 has dtype int64, but tensor 0 has dtype float32");
    EXPECT_THROW(pg.newGroup({0, 0}), ValueError);
    EXPECT_THROW(pg.newGroup({0, 7}), ValueError);
    // Nothing above took a sequence number, so the ranks are still in step.
    EXPECT_EQ(pg.sequenceNumber(), 0u);
    pg.barrier()->wait();
  });
}

TEST(ProcessGroup, RoutesByDevice) {
  auto pg = soloGroup("allreduce_only");
  std::string msg = errorOf([&] { pg->backend(DeviceType::CUDA); });
  EXPECT_NE(msg.find("has no backend for cuda"), std::string::npos) << msg;
  EXPECT_EQ(pg->backend(DeviceType::CPU).name(), "allreduce_only");
}

TEST(ProcessGroup, FlightRecorderKeepsTheLastOps) {
  auto pg = soloGroup("allreduce_only", {.name = "fr", .flightRecorderEntries = 3});
  for (int k = 0; k < 5; ++k) {
    Tensor t = zeros({2, 2});
    pg->allreduce(t, {.op = ReduceOp::Max})->wait();
  }
  auto entries = pg->flightRecorder().entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries.front().seq, 3u);
  EXPECT_EQ(entries.back().seq, 5u);
  EXPECT_EQ(entries.back().op, "allreduce");
  EXPECT_EQ(entries.back().shapes, "[2, 2] float32");
  EXPECT_EQ(entries.back().state, FlightRecorder::State::Completed);
  EXPECT_EQ(entries.back().detail, "op=max");
  std::string json = pg->flightRecorder().dumpJson();
  EXPECT_NE(json.find("\"group\": \"fr\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"completed\""), std::string::npos) << json;
}

TEST(ProcessGroup, FlightRecorderSizeComesFromTheEnvironmentWhenSet) {
  EnvGuard env;
  env.set("COHORT_FLIGHT_RECORDER_ENTRIES", "2");
  auto pg = soloGroup("allreduce_only", {.name = "fr_env", .flightRecorderEntries = 50});
  EXPECT_EQ(pg->flightRecorder().capacity(), 2u);
  for (int k = 0; k < 4; ++k) {
    Tensor t = zeros({1});
    pg->allreduce(t)->wait();
  }
  EXPECT_EQ(pg->flightRecorder().entries().size(), 2u);
  env.set("COHORT_FLIGHT_RECORDER_ENTRIES", "0");  // off: ops still run, nothing is kept
  auto off = soloGroup("allreduce_only", {.name = "fr_off"});
  Tensor t = zeros({1});
  off->allreduce(t)->wait();
  EXPECT_TRUE(off->flightRecorder().entries().empty());
  for (const char* bad : {"-1", "lots", "10000001"}) {
    env.set("COHORT_FLIGHT_RECORDER_ENTRIES", bad);
    std::string msg = errorOf([] { soloGroup("allreduce_only", {.name = "fr_bad"}); });
    EXPECT_NE(msg.find("COHORT_FLIGHT_RECORDER_ENTRIES"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(ProcessGroup, ProgressIsPublishedInTheStore) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.backend = "allreduce_only";
  auto pg = ProcessGroup::create(store, 0, 1, o);
  Tensor t = zeros({1});
  pg->allreduce(t)->wait();
  pg->allreduce(t)->wait();
  // Published from a background thread: wait for it to catch up.
  std::string v;
  for (int i = 0; i < 200; ++i) {
    v = store->check({"world/progress/0"}) ? store->getString("world/progress/0") : "";
    if (v == "2 2 0") break;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(v, "2 2 0");
}

TEST(Work, WaitTimeoutNamesTheRanksThatNeverArrived) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  ThreadWorld world("gloo", 3);
  world.run([&](int r) {
    auto& pg = world.pg(r);
    Tensor t = zeros({10});
    pg.allreduce(t)->wait();  // #1 everyone
    if (r == 2) return;       // rank 2 never calls #2
    auto w = pg.allreduce(t, {.timeout = Millis(500)});
    auto start = std::chrono::steady_clock::now();
    std::string msg;
    try {
      w->wait();
      msg = "(no error)";
    } catch (const TimeoutError& e) {
      msg = e.what();
    }
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, 5s);
    EXPECT_NE(msg.find("allreduce #2 in group 'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("never reached it: [2]"), std::string::npos) << msg;
    EXPECT_FALSE(w->isSuccess());
    // The backend is aborted after a timeout: later ops fail at once instead of hanging.
    EXPECT_THROW(pg.allreduce(t)->wait(), DistError);
  });
}

// After a group is aborted every later op fails at once with the abort's reason: collectives and
// point-to-point alike (a send on an aborted gloo group used to deadlock on the backend's own lock).
TEST(ProcessGroup, OpsAfterAnAbortFailWithItsReasonAndNeverHang) {
  for (const char* backend : {"gloo", "shm"}) {
    if (!hasBackend(backend)) continue;
    SCOPED_TRACE(backend);
    ThreadWorld world(backend, 2, Millis(5'000));
    world.run([&](int r) {
      ProcessGroup& pg = world.pg(r);
      pg.backend(DeviceType::CPU).abort(fmt::format("rank {} gave up", r));
      Tensor t = ones({4});
      auto expectAborted = [&](const WorkPtr& w, const std::string& op) {
        try {
          w->wait(Millis(10'000));
          ADD_FAILURE() << op << " on rank " << r << " succeeded after the abort";
        } catch (const DistError& e) {
          EXPECT_NE(std::string(e.what()).find("gave up"), std::string::npos) << op << ": " << e.what();
        }
      };
      expectAborted(pg.allreduce(t), "allreduce");
      if (pg.backend(DeviceType::CPU).supports(OpType::Send)) {
        expectAborted(pg.send(t, 1 - r), "send");
        expectAborted(pg.recv(t, 1 - r), "recv");
      }
    });
  }
}

TEST(Work, FutureCarriesTheOutputs) {
  auto pg = soloGroup("allreduce_only");
  Tensor t = zeros({2});
  auto w = pg->allreduce(t);
  auto doubled = w->future().then([](Future<std::vector<Tensor>> f) { return f.value()[0].numel() * 2; });
  EXPECT_EQ(doubled.value(), 4);
  EXPECT_TRUE(w->result()[0].isSameAs(t));
  EXPECT_EQ(w->describe(), "allreduce #1 in group 'world'");
}

// ---- Work on its own: completion, the lazily made Future, timeouts and aborts ----------------

WorkPtr bareWork(uint64_t seq = 3) { return std::make_shared<Work>(OpType::Allreduce, seq, "g", Millis(60'000)); }

TEST(Work, AFutureTakenBeforeCompletionIsCompletedOnceAndIsTheSameOnEveryCall) {
  auto w = bareWork();
  auto f1 = w->future();
  auto f2 = w->future();
  std::atomic<int> ran{0};
  auto doubled = f1.then([&](Future<std::vector<Tensor>> f) {
    ++ran;
    return f.value().at(0).numel() * 2;
  });
  EXPECT_FALSE(f2.isCompleted());
  EXPECT_FALSE(w->isCompleted());
  EXPECT_EQ(w->exception(), nullptr);
  Tensor t = zeros({3});
  std::thread finisher([&] { w->finish(completionKeyForTests(), {t}); });
  finisher.join();
  EXPECT_TRUE(f2.isCompleted());  // the same Future as f1
  EXPECT_EQ(doubled.value(), 6);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(w->isSuccess());
  EXPECT_TRUE(w->result().at(0).isSameAs(t));
  EXPECT_TRUE(w->future().value().at(0).isSameAs(t));
}

TEST(Work, AFutureTakenAfterAFailureCarriesTheError) {
  auto w = bareWork();
  w->fail(completionKeyForTests(), std::make_exception_ptr(PeerError("rank 1 went away")));
  EXPECT_TRUE(w->isCompleted());
  EXPECT_FALSE(w->isSuccess());
  ASSERT_NE(w->exception(), nullptr);
  auto f = w->future();
  ASSERT_TRUE(f.isCompleted());
  EXPECT_THROW(f.value(), PeerError);
  EXPECT_THROW(w->wait(), PeerError);
  EXPECT_THROW(w->wait(Millis(1)), PeerError);
  EXPECT_THROW(w->result(), PeerError);
}

TEST(Work, CompletingTwiceIsABrokenInvariantAndKeepsTheFirstResult) {
  auto w = bareWork();
  Tensor t = zeros({1});
  w->finish(completionKeyForTests(), {t});
  try {
    w->fail(completionKeyForTests(), std::make_exception_ptr(DistError("late")));
    ADD_FAILURE() << "a second completion was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #3 in group 'g' completed twice"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(w->isSuccess());
  EXPECT_TRUE(w->result().at(0).isSameAs(t));
}

TEST(Work, WaitWakesWhenAnotherThreadCompletes) {
  auto w = bareWork();
  std::thread finisher([&] {
    std::this_thread::sleep_for(Millis(30));
    w->finish(completionKeyForTests(), {});
  });
  w->wait(Millis(30'000));
  EXPECT_TRUE(w->isSuccess());
  finisher.join();
}

// Completion, a chained Future and a waiter racing on three threads: the callback runs exactly
// once and the waiter sees the outcome the completer chose. (Also run under TSan with work.cc
// instrumented while this was written.)
TEST(Work, RacingCompletionFutureAndWaiterSeeOneOutcome) {
  int wrongOutcome = 0, wrongCallbacks = 0;
  for (int round = 0; round < 300; ++round) {
    auto w = bareWork(round + 1);
    const bool fail = round % 3 == 0;
    std::atomic<int> callbacks{0};
    std::atomic<bool> go{false};
    std::thread completer([&] {
      while (!go.load()) std::this_thread::yield();
      if (fail) {
        w->fail(completionKeyForTests(), std::make_exception_ptr(DistError("x")));
      } else {
        w->finish(completionKeyForTests(), {});
      }
    });
    std::thread chainer([&] {
      while (!go.load()) std::this_thread::yield();
      w->future().addCallback([&](Future<std::vector<Tensor>>) { ++callbacks; });
    });
    std::thread waiter([&] {
      while (!go.load()) std::this_thread::yield();
      try {
        w->wait(Millis(30'000));
        wrongOutcome += fail;
      } catch (const DistError&) {
        wrongOutcome += !fail;
      }
    });
    go = true;
    completer.join();
    chainer.join();
    waiter.join();
    wrongCallbacks += callbacks.load() != 1;
  }
  EXPECT_EQ(wrongOutcome, 0);
  EXPECT_EQ(wrongCallbacks, 0);
}

// A backend that only records abort() calls.
class AbortRecordingBackend : public Backend {
 public:
  AbortRecordingBackend() : Backend("abort_recording", 0, 1) {}
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    reasons.push_back(reason);
  }
  std::mutex mu;
  std::vector<std::string> reasons;
};

TEST(Work, ATimedOutWaitAbortsTheBackendOnceAndNamesTheOp) {
  auto backend = std::make_shared<AbortRecordingBackend>();
  auto w = bareWork(9);
  w->setAbortBackend(completionKeyForTests(), backend);
  std::string first = errorOf([&] { w->wait(Millis(10)); });
  EXPECT_NE(first.find("allreduce #9 in group 'g' not finished after wait(10 ms)"), std::string::npos) << first;
  EXPECT_THROW(w->wait(Millis(10)), TimeoutError);
  ASSERT_EQ(backend->reasons.size(), 1u);
  EXPECT_EQ(backend->reasons[0], "allreduce #9 in group 'g': abandoned by wait() after its timeout");
  // The backend's own abort function, when it installs one, is used instead.
  auto w2 = bareWork(10);
  w2->setAbortBackend(completionKeyForTests(), backend);
  int own = 0;
  w2->setAbort(completionKeyForTests(), [&] { ++own; });
  EXPECT_THROW(w2->wait(Millis(5)), TimeoutError);
  EXPECT_EQ(own, 1);
  EXPECT_EQ(backend->reasons.size(), 1u);
  // A Work does not keep its backend alive: once the backend is gone, a timeout just throws.
  auto w3 = bareWork(11);
  w3->setAbortBackend(completionKeyForTests(), backend);
  backend.reset();
  EXPECT_THROW(w3->wait(Millis(5)), TimeoutError);
}

TEST(Work, WaitWithoutATimeoutGivesUpAfterTheOpsDeadline) {
  auto w = std::make_shared<Work>(OpType::Barrier, 4, "g", Millis(20));
  auto start = std::chrono::steady_clock::now();
  std::string msg = errorOf([&] { w->wait(); });
  EXPECT_NE(msg.find("barrier #4 in group 'g' timed out after 20 ms"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace cohort::dist::testing
