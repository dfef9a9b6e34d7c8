// send/recv of the shm backend (its rings, shm_p2p.h), beyond what the collectives suite checks:
// messages that arrive before their recv, in and across tags; a tensor of the wrong size; messages
// far larger than the ring, both ways at once; timeouts; and a sender that dies (forked ranks).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <cohort/config.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/process_group.h>
#include <cohort/distributed/shm/shm_backend.h>
#include <cohort/distributed/store/file_store.h>

#include "distributed/fork_util.h"
#include "harness/world.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;
using ::cohort::testing::ThreadWorld;

#if COHORT_USE_SHM
// "shm" whose send/recv rings hold 4 KiB: larger messages stream through in chunks.
const bool kTinyRingsRegistered = [] {
  registerBackend("shm_tiny_rings",
                  [](const StorePtr& store, int rank, int size, const BackendOptions& opts) -> BackendPtr {
                    shm_backend::ShmConfig c;
                    c.p2pBytes = 4096;
                    return std::make_shared<shm_backend::ShmBackend>(store, rank, size, opts, c);
                  });
  return true;
}();
#endif

// 0, 1, 2, ... shifted by `from`, as float32.
Tensor ramp(int64_t n, float from) { return add(arange(0, n).to(DType::Float32), Scalar(from)); }

void expectRamp(const Tensor& t, int64_t n, float from, const std::string& what) {
  ASSERT_EQ(t.numel(), n) << what;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != from + static_cast<float>(i)) {
      ADD_FAILURE() << what << ": element " << i << " is " << p[i] << ", expected " << from + static_cast<float>(i);
      return;
    }
  }
}

class ShmP2P : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hasBackend("shm")) GTEST_SKIP() << "shm is not built";
  }
};

// Rank 0 sends three messages with tag 3 (of different sizes) and two with tag 4, all before rank
// 1 posts a recv; rank 1 then takes tag 4 first. Each recv gets the message of its tag that was
// sent earliest among those not yet taken.
TEST_F(ShmP2P, MessagesThatArriveBeforeTheirRecvAreMatchedInSendOrderPerTag) {
  for (const std::string backend : {"shm", "shm_tiny_rings"}) {
    SCOPED_TRACE(backend);
    ThreadWorld world(backend, 2);
    world.run([&](int r) {
      auto& pg = world.pg(r);
      const std::vector<int64_t> sizes3 = {5, 3000, 0}, sizes4 = {2000, 7};
      if (r == 0) {
        std::vector<WorkPtr> sends;
        for (size_t k = 0; k < 3; ++k) {
          sends.push_back(pg.send(ramp(sizes3[k], 100.0f * k), 1, {.tag = 3}));
          if (k < 2) sends.push_back(pg.send(ramp(sizes4[k], 1000.0f + 100.0f * k), 1, {.tag = 4}));
        }
        for (auto& w : sends) w->wait();
        Tensor flag = ones({1});
        pg.send(flag, 1, {.tag = 9})->wait();
        return;
      }
      Tensor flag = zeros({1});
      pg.recv(flag, 0, {.tag = 9})->wait();  // everything above was sent (tag 9 went last)
      for (size_t k = 0; k < 2; ++k) {
        Tensor t = zeros({sizes4[k]});
        pg.recv(t, 0, {.tag = 4})->wait();
        expectRamp(t, sizes4[k], 1000.0f + 100.0f * k, fmt::format("tag 4, message {}", k));
      }
      for (size_t k = 0; k < 3; ++k) {
        Tensor t = zeros({sizes3[k]});
        pg.recv(t, 0, {.tag = 3})->wait();
        expectRamp(t, sizes3[k], 100.0f * k, fmt::format("tag 3, message {}", k));
      }
    });
  }
}

// The pipeline's pattern: a header, then the data, sent back to back; the receiver posts the
// data's recv from the header's completion callback. The data goes straight into its tensor: the
// progress thread completes the header's recv before it takes the data out of the ring.
TEST_F(ShmP2P, ARecvPostedByTheLastMessagesCallbackTakesTheNextOneDirectly) {
  ThreadWorld world("shm", 2);
  std::vector<Tensor> got(20);
  world.run([&](int r) {
    auto& pg = world.pg(r);
    for (int k = 0; k < 20; ++k) {
      Tensor ready = zeros({1});
      if (r == 0) {
        pg.recv(ready, 1, {.tag = 100 + k})->wait();  // rank 1's header recv is posted
        Tensor header = fromVector<int64_t>({1000 + k}, {1});
        pg.send(header, 1, {.tag = 2 * k})->wait();
        pg.send(ramp(1000 + k, static_cast<float>(k)), 1, {.tag = 2 * k + 1})->wait();
        continue;
      }
      Tensor header = zeros({1}, {.dtype = DType::Int64});
      std::promise<WorkPtr> data;
      auto h = pg.recv(header, 0, {.tag = 2 * k});
      h->future().addCallback([&, k](const Future<std::vector<Tensor>>&) {
        got[k] = zeros({header.data<int64_t>()[0]});
        data.set_value(pg.recv(got[k], 0, {.tag = 2 * k + 1}));
      });
      pg.send(ready, 0, {.tag = 100 + k})->wait();
      data.get_future().get()->wait();
      expectRamp(got[k], 1000 + k, static_cast<float>(k), fmt::format("message {}", k));
    }
  });
  auto& shm = dynamic_cast<shm_backend::ShmBackend&>(world.pg(1).backend(DeviceType::CPU));
  EXPECT_EQ(shm.bufferedMessages(), 0u);
}

// A recv whose tensor has another size than the message fails with a DistError naming both sizes;
// the message is dropped and the next one on that tag arrives intact.
TEST_F(ShmP2P, ARecvOfTheWrongSizeIsADistErrorAndTheNextMessageArrives) {
  for (const std::string backend : {"shm", "shm_tiny_rings"}) {
    SCOPED_TRACE(backend);
    ThreadWorld world(backend, 2);
    world.run([&](int r) {
      auto& pg = world.pg(r);
      if (r == 0) {
        pg.send(ramp(3000, 0.0f), 1, {.tag = 5})->wait();
        pg.send(ramp(10, 7.0f), 1, {.tag = 5})->wait();
        return;
      }
      Tensor wrong = zeros({2999});
      auto w = pg.recv(wrong, 0, {.tag = 5});
      try {
        w->wait();
        ADD_FAILURE() << "a recv of 2999 floats took a message of 3000";
      } catch (const PeerError& e) {
        ADD_FAILURE() << "a size mismatch is not a peer's failure: " << e.what();
      } catch (const DistError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("12000 bytes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("11996"), std::string::npos) << msg;
        EXPECT_NE(msg.find("recv (from rank 0, tag 5)"), std::string::npos) << msg;
      }
      Tensor next = zeros({10});
      pg.recv(next, 0, {.tag = 5})->wait();
      expectRamp(next, 10, 7.0f, "the message after the mismatch");
    });
  }
}

// Both ranks send 4 MiB to each other before receiving, through 4 KiB rings: the sends cannot
// complete until the other side receives, so they must not hold up the recvs.
TEST_F(ShmP2P, MessagesFarLargerThanTheRingGoBothWaysAtOnce) {
  ThreadWorld world("shm_tiny_rings", 2);
  world.run([&](int r) {
    auto& pg = world.pg(r);
    const int64_t n = 1 << 20;
    for (int round = 0; round < 3; ++round) {
      Tensor out = ramp(n, 1e6f * r + round);
      auto s = pg.send(out, 1 - r, {.tag = 1});
      Tensor in = zeros({n});
      pg.recv(in, 1 - r, {.tag = 1})->wait();
      s->wait();
      expectRamp(in, n, 1e6f * (1 - r) + round, fmt::format("round {}", round));
    }
  });
}

// Nothing is ever sent: the recv fails with a TimeoutError at its deadline, naming it, and the
// group is broken (a late message must not reach a later recv): the next op fails at once.
TEST_F(ShmP2P, ARecvThatNothingReachesTimesOutAndBreaksTheGroup) {
  ThreadWorld world("shm", 2, Millis(300));
  world.run([&](int r) {
    auto& pg = world.pg(r);
    if (r == 0) return;
    Tensor t = zeros({4});
    const auto start = std::chrono::steady_clock::now();
    auto w = pg.recv(t, 0, {.tag = 2});
    try {
      w->wait();
      ADD_FAILURE() << "the recv completed";
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("recv (from rank 0, tag 2)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("timed out after 300 ms"), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    auto later = pg.send(t, 0, {.tag = 2});
    EXPECT_TRUE(later->isCompleted());
    EXPECT_THROW(later->wait(), PeerError);
  });
}

// A message larger than the ring that nobody receives: the send times out instead of hanging.
TEST_F(ShmP2P, ASendThatIsNeverReceivedTimesOut) {
  ThreadWorld world("shm_tiny_rings", 2, Millis(300));
  world.run([&](int r) {
    auto& pg = world.pg(r);
    if (r == 1) return;
    auto w = pg.send(ramp(100'000, 0.0f), 1, {.tag = 8});
    try {
      w->wait();
      ADD_FAILURE() << "the send completed";
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("send (to rank 1, tag 8)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("of 400000 bytes sent"), std::string::npos) << msg;
    }
  });
}

// Forked ranks: rank 1 waits for a message rank 0 never sends, because rank 0 dies. Rank 1's recv
// fails with a PeerError naming rank 0 well before its 20 s timeout.
TEST_F(ShmP2P, ARecvFromARankThatDiesFailsFastNamingIt) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  auto results = runForked(2, 60s, dir, [&](int rank) -> std::string {
    auto store = std::make_shared<FileStore>(dir + "/store", Millis(30'000));
    ProcessGroupOptions o;
    o.backend = "shm";
    o.timeout = Millis(20'000);
    o.name = fmt::format("p2pdeath{}", getppid());
    auto pg = ProcessGroup::create(store, rank, 2, o);
    Tensor t = ones({16});
    if (rank == 0) {
      pg->send(t, 1, {.tag = 1})->wait();
      std::this_thread::sleep_for(200ms);
      raise(SIGKILL);
    }
    pg->recv(t, 0, {.tag = 1})->wait();
    Outcome outcome = classifyOutcome([&] { pg->recv(t, 0, {.tag = 1})->wait(); });
    return fmt::format("{}|{}|{}", outcome.kind, outcome.seconds, outcome.message);
  });
  EXPECT_TRUE(WIFSIGNALED(results[0].status) && WTERMSIG(results[0].status) == SIGKILL);
  ASSERT_TRUE(results[1].ok()) << results[1].describe() << ": " << results[1].report;
  Outcome o = parseOutcome(results[1].report);
  EXPECT_EQ(o.kind, "PeerError") << o.message;
  EXPECT_LT(o.seconds, 5.0) << o.message;
  EXPECT_NE(o.message.find("rank [0]"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("died"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("recv (from rank 0, tag 1)"), std::string::npos) << o.message;
}

}  // namespace
}  // namespace cohort::dist::testing
