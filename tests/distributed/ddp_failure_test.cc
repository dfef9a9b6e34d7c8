// DDP with ranks as forked processes: a rank killed in the middle of backward (after its first
// bucket went out) makes every survivor's backward fail with a DistError naming the dead rank,
// within the group's timeout, instead of hanging.
#include <gtest/gtest.h>

#include <iostream>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/store/file_store.h>

#include "fork_util.h"

namespace cohort::dist::testing {
namespace {

using namespace std::chrono_literals;

TEST(DDPFailure, RankKilledMidBackwardFailsEverySurvivorWithItsName) {
  if (!hasBackend("gloo")) GTEST_SKIP() << "gloo is not built";
  TempDir dir;
  constexpr int kSize = 3, kDead = 2;
  auto results = runForked(
      kSize, 60s,
      [&](int rank, std::ostream& report) {
        auto store = std::make_shared<FileStore>(dir.file("store"), Millis(30'000));
        ProcessGroupOptions o;
        o.backend = "gloo";
        o.timeout = Millis(3000);
        auto pg = ProcessGroup::create(store, rank, kSize, o);
        Generator g(7);
        auto net =
            std::make_shared<nn::Sequential>(nn::Linear(32, 64, true, &g), nn::Tanh(), nn::Linear(64, 64, true, &g),
                                             nn::Tanh(), nn::Linear(64, 4, true, &g));
        // One bucket per layer or so: the dead rank gets one bucket out, then dies.
        DistributedDataParallel ddp(net, pg, {.bucketCapMb = 8e-3, .firstBucketCapMb = 2e-3});
        auto def = allreduceHook();
        int launched = 0;
        ddp.registerCommHook(makeCommHook("die_on_second_bucket", [&](ProcessGroup& group, GradBucket& b) {
          if (rank == kDead && ++launched == 2) raise(SIGKILL);
          return def->run(group, b);
        }));
        Tensor x = randn({8, 32}, {}, &g), y = randn({8, 4}, {}, &g);
        return reportOutcome(report, [&] { nn::functional::mseLoss(ddp(x), y).backward(); });
      },
      dir);
  for (int r = 0; r < kSize; ++r) {
    const auto& res = results[r];
    EXPECT_FALSE(res.killedByWatchdog) << "rank " << r << " hung: " << res.report;
    if (r == kDead) {
      EXPECT_TRUE(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGKILL) << "rank " << r << " should have died";
      continue;
    }
    ASSERT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0)
        << "rank " << r << " ended with " << describeStatus(res.status) << ": " << res.report;
    auto [kind, secs, msg] = parseOutcome(res.report);
    std::cout << "rank " << r << " (" << secs << " s): " << kind << ": " << msg << "\n";
    EXPECT_TRUE(kind == "PeerError" || kind == "TimeoutError") << "rank " << r << ": " << res.report;
    EXPECT_LT(secs, 3.0 + 5.0) << "rank " << r << " waited past the timeout and its grace";
    EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("[{}]", kDead)), std::string::npos)
        << "rank " << r << " did not name the dead rank: " << msg;
  }
}

}  // namespace
}  // namespace cohort::dist::testing
