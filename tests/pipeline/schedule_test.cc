// Schedules as data: the built-ins are complete and deadlock-free, the checker names the first
// action of a broken schedule, and the simulator's bubbles and peaks match the formulas.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cohort/pipeline/schedule.h>

namespace cohort::pipeline {
namespace {

using K = ActionKind;

std::string errorOf(const Schedule& s) {
  try {
    check(s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

TEST(Schedule, BuiltInsAreCompleteAndDeadlockFree) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 12; ++m) {
      for (const char* name : {"gpipe", "1f1b", "zb"}) {
        Schedule s = makeSchedule(name, p, m);
        EXPECT_NO_THROW(check(s)) << name << " p=" << p << " m=" << m;
        EXPECT_EQ(s.splitsBackward(), std::string(name) == "zb");
      }
      if (m % p == 0)
        for (int v = 1; v <= 3; ++v) {
          Schedule s = interleaved1F1B(p, v, m);
          EXPECT_EQ(s.stages, p * v);
          EXPECT_NO_THROW(check(s)) << "interleaved p=" << p << " v=" << v << " m=" << m;
        }
    }
}

TEST(Schedule, InterleavedNeedsWholeGroupsOfMicrobatches) {
  try {
    interleaved1F1B(4, 2, 6);
    FAIL() << "no error";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("6 micro-batches do not divide into groups of 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(makeSchedule("pipedream", 2, 4), ScheduleError);
  EXPECT_THROW(makeSchedule("1f1b", 2, 4, 2), ScheduleError);
  EXPECT_THROW(gpipe(0, 4), ScheduleError);
  EXPECT_THROW(oneFOneB(2, 0), ScheduleError);
}

TEST(Schedule, VShapeHoldsTwoStagesPerRankInAV) {
  EXPECT_EQ(vPlacement(3), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(vPlacement(1), (std::vector<int>{0, 0}));
  ActionCosts unit;  // forward 1, backward 2
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m)
      for (int la = 0; la <= 3; ++la) {
        const std::string what = fmt::format("v p={} m={} lookahead={}", p, m, la);
        const Schedule v = vShape1F1B(p, m, la);
        EXPECT_EQ(v.name, "v");
        EXPECT_EQ(v.stages, 2 * p) << what;
        EXPECT_EQ(v.placement, vPlacement(p)) << what;
        EXPECT_FALSE(v.splitsBackward()) << what;
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(v.stagesOf(r), (std::vector<int>{r, 2 * p - 1 - r})) << what;
          // Every stage's micro-batches in order, forwards and backwards.
          std::vector<int> nextF(static_cast<size_t>(2 * p), 0), nextB(static_cast<size_t>(2 * p), 0);
          for (const Action& a : v.actions[static_cast<size_t>(r)]) {
            auto& next = a.kind == K::Forward ? nextF : nextB;
            EXPECT_EQ(a.microbatch, next[static_cast<size_t>(a.stage)]++) << what << ": " << a.str();
          }
        }
        Simulation sim;
        ASSERT_NO_THROW(sim = simulate(v, unit)) << what;
        // Never a bigger bubble than 1F1B's; live activations bounded by the forwards' gate (2p + 1
        // + lookahead) and the second stage's forwards, which it never holds back.
        EXPECT_LE(sim.bubble, simulate(oneFOneB(p, m), unit).bubble + 1e-12) << what;
        for (int r = 0; r < p; ++r) {
          EXPECT_LE(sim.peakActivations[static_cast<size_t>(r)], 2 * p + 1 + la + 2) << what << " rank " << r;
        }
        // The first rank holds the first stage and the last: it starts the step and never waits
        // for the first activation.
        EXPECT_DOUBLE_EQ(sim.timeline[0][0].start, 0.0) << what;
      }
  // Two ranks, unit costs: interleaved 1F1B's bubble, (p - 1) / (2m + p - 1), from 3 micro-batches
  // on (1/17 at m = 8, against 1F1B's 1/9), for any m.
  for (int m = 3; m <= 12; ++m) {
    EXPECT_NEAR(simulate(vShape1F1B(2, m), unit).bubble, 1.0 / (2 * m + 1), 1e-12) << "m=" << m;
  }
  // A last stage half again as dear as the others (a language model's head and loss): its rank
  // runs from the first moment to the last, and the V beats interleaved 1F1B.
  for (int p = 2; p <= 4; ++p)
    for (int m : {2 * p, 4 * p}) {
      ActionCosts heavy;
      heavy.forward.assign(static_cast<size_t>(2 * p), 1.0);
      heavy.backward.assign(static_cast<size_t>(2 * p), 2.0);
      heavy.forward.back() = 1.5;
      heavy.backward.back() = 3.0;
      EXPECT_LT(simulate(vShape1F1B(p, m), heavy).makespan, simulate(interleaved1F1B(p, 2, m), heavy).makespan)
          << "p=" << p << " m=" << m;
    }
  EXPECT_EQ(makeSchedule("v", 3, 5).actions, vShape1F1B(3, 5).actions);
  EXPECT_EQ(makeSchedule("v", 3, 5, 2, 1).actions, vShape1F1B(3, 5, 1).actions);
  try {
    makeSchedule("v", 2, 4, 3);
    FAIL() << "no error";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("schedule 'v' holds two stages per rank, not 3 chunks"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(vShape1F1B(0, 4), ScheduleError);
  EXPECT_THROW(vShape1F1B(2, 0), ScheduleError);
  EXPECT_THROW(vShape1F1B(2, 4, -1), ScheduleError);
  EXPECT_EQ(scheduleNames(), (std::vector<std::string>{"gpipe", "1f1b", "interleaved", "v", "zb"}));
}

TEST(Schedule, CommunicationIsInsertedAroundComputeOnly) {
  Schedule s = withCommunication(oneFOneB(2, 2));
  // Rank 0: F0 SF0 F1 SF1 RB0 B0 RB1 B1 (stage 0 sends no gradient: it has no previous stage).
  std::vector<Action> r0{{K::Forward, 0, 0},        {K::SendActivation, 0, 0}, {K::Forward, 0, 1},
                         {K::SendActivation, 0, 1}, {K::RecvGradient, 0, 0},   {K::Backward, 0, 0},
                         {K::RecvGradient, 0, 1},   {K::Backward, 0, 1}};
  EXPECT_EQ(s.actions[0], r0);
  std::vector<Action> r1{{K::RecvActivation, 1, 0}, {K::Forward, 1, 0}, {K::Backward, 1, 0}, {K::SendGradient, 1, 0},
                         {K::RecvActivation, 1, 1}, {K::Forward, 1, 1}, {K::Backward, 1, 1}, {K::SendGradient, 1, 1}};
  EXPECT_EQ(s.actions[1], r1);
  // Stages on one rank hand over in memory: interleaved on one rank has no communication.
  EXPECT_FALSE(withCommunication(interleaved1F1B(1, 3, 2)).hasCommunication());
}

TEST(Schedule, CheckerRejectsAMissingBackward) {
  Schedule s = oneFOneB(2, 3);
  auto& r1 = s.actions[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{K::Backward, 1, 2}));
  EXPECT_EQ(errorOf(s), "schedule '1f1b': rank 1 never runs the backward (B, or I and W) of micro-batch 2 on stage 1");
  Schedule z = zeroBubble(2, 2);
  auto& z0 = z.actions[0];
  z0.erase(std::find(z0.begin(), z0.end(), Action{K::BackwardWeight, 0, 1}));
  EXPECT_NE(errorOf(z).find("never runs the weight backward (W) after its I of micro-batch 1 on stage 0"),
            std::string::npos)
      << errorOf(z);
}

TEST(Schedule, CheckerRejectsASendWithoutItsReceive) {
  Schedule s = withCommunication(gpipe(2, 2));
  auto& r1 = s.actions[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{K::RecvActivation, 1, 1}));
  EXPECT_EQ(errorOf(s),
            "schedule 'gpipe': SF(stage 0, micro-batch 1) on rank 0 has no matching RF(stage 1, micro-batch 1) on "
            "rank 1");
}

TEST(Schedule, CheckerRejectsACycle) {
  // Rank 0 waits for micro-batch 0's gradient before sending micro-batch 1's activation; rank 1
  // takes micro-batch 1 before it gives micro-batch 0's gradient back: each waits for the other.
  Schedule s;
  s.name = "crossed";
  s.ranks = 2;
  s.stages = 2;
  s.microbatches = 2;
  s.placement = {0, 1};
  s.actions = {{{K::Forward, 0, 0}, {K::Backward, 0, 0}, {K::Forward, 0, 1}, {K::Backward, 0, 1}},
               {{K::Forward, 1, 1}, {K::Forward, 1, 0}, {K::Backward, 1, 0}, {K::Backward, 1, 1}}};
  EXPECT_EQ(errorOf(s),
            "schedule 'crossed' deadlocks: rank 0 waits at action 2 (RB(stage 0, micro-batch 0)) for "
            "SB(stage 1, micro-batch 0) on rank 1; rank 1 waits at action 0 (RF(stage 1, micro-batch 1)) for "
            "SF(stage 0, micro-batch 1) on rank 0, which waits in turn: a cycle");
  // A backward before its own forward on one rank.
  Schedule t = gpipe(1, 2);
  std::swap(t.actions[0][0], t.actions[0][2]);
  EXPECT_EQ(errorOf(t),
            "schedule 'gpipe' deadlocks: rank 0 waits at action 0 (B(stage 0, micro-batch 0)) for F(stage 0, "
            "micro-batch 0), which comes later on rank 0 (action 2)");
}

TEST(Schedule, CheckerRejectsMalformedActions) {
  Schedule s = gpipe(2, 2);
  s.actions[0].push_back({K::Forward, 1, 0});
  EXPECT_NE(errorOf(s).find("rank 0 action 4 (F(stage 1, micro-batch 0)) is on the wrong rank: stage 1 is on rank 1"),
            std::string::npos)
      << errorOf(s);
  Schedule d = gpipe(2, 2);
  d.actions[1].push_back({K::Forward, 1, 1});
  EXPECT_NE(errorOf(d).find("repeats the action at rank 1 position 1"), std::string::npos) << errorOf(d);
  Schedule o = gpipe(2, 2);
  o.actions[1].push_back({K::Forward, 1, 7});
  EXPECT_NE(errorOf(o).find("names a micro-batch outside 0..1"), std::string::npos) << errorOf(o);
  Schedule b = gpipe(2, 2);
  b.actions[1].push_back({K::BackwardInput, 1, 0});
  EXPECT_NE(errorOf(b).find("has both a full backward (B) and a split one (I/W)"), std::string::npos) << errorOf(b);
  Schedule pl = gpipe(2, 2);
  pl.placement = {0, 2};
  EXPECT_NE(errorOf(pl).find("stage 1 is placed on rank 2, outside 0..1"), std::string::npos) << errorOf(pl);
}

TEST(Simulator, FillDrainAndOneFOneBBubbleIsTheTextbookFormula) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 16; ++m)
      for (double fb : {1.0, 2.0}) {
        ActionCosts c;
        c.forward = {1.0};
        c.backward = {fb};
        const double expected = static_cast<double>(p - 1) / (m + p - 1);
        EXPECT_NEAR(simulate(gpipe(p, m), c).bubble, expected, 1e-12) << "gpipe p=" << p << " m=" << m;
        EXPECT_NEAR(simulate(oneFOneB(p, m), c).bubble, expected, 1e-12) << "1f1b p=" << p << " m=" << m;
      }
}

TEST(Simulator, InterleavedBubbleShrinksWithTheChunks) {
  // Megatron-LM: the bubble is (p - 1) / v of a stage's per-micro-batch time, against m of them.
  for (int p = 2; p <= 4; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m = p; m <= 4 * p; m += p) {
        Simulation sim = simulate(interleaved1F1B(p, v, m));
        EXPECT_NEAR(sim.bubble, static_cast<double>(p - 1) / (v * m + p - 1), 1e-12)
            << "p=" << p << " v=" << v << " m=" << m;
      }
}

TEST(Simulator, ZeroBubbleIsAThirdOfOneFOneBs) {
  // Qi et al.: with T_F = T_B = T_W, ZB-H1's bubble is (p - 1)(T_F + T_B - T_W) against 1F1B's
  // (p - 1)(T_F + T_B + T_W).
  for (int p = 2; p <= 6; ++p)
    for (int m = p; m <= 3 * p + 1; ++m) {
      Simulation zb = simulate(zeroBubble(p, m));
      EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + (p - 1)) << "p=" << p << " m=" << m;
      EXPECT_NEAR(zb.bubble, static_cast<double>(p - 1) / (3 * m + p - 1), 1e-12);
      ActionCosts c;
      c.backward = {2.0};
      EXPECT_DOUBLE_EQ(simulate(oneFOneB(p, m), c).makespan, 3.0 * m + 3 * (p - 1));
    }
}

TEST(Simulator, PeakActivations) {
  const int p = 4, m = 8;
  Simulation g = simulate(gpipe(p, m)), o = simulate(oneFOneB(p, m)), z = simulate(zeroBubble(p, m));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(g.peakActivations[r], m);              // GPipe grows with the micro-batches
    EXPECT_EQ(o.peakActivations[r], p - r);          // 1F1B with the stages
    EXPECT_LE(z.peakActivations[r], 2 * p - r - 1);  // zero bubble: + postponed weight backwards
    EXPECT_GE(z.peakActivations[r], o.peakActivations[r]);
  }
}

TEST(Schedule, ALookaheadRunsForwardsAheadAndKeepsEveryScheduleValid) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 12; ++m)
      for (int la = 1; la <= 3; ++la) {
        Schedule o = oneFOneB(p, m, la), z = zeroBubble(p, m, la);
        EXPECT_NO_THROW(check(o)) << "1f1b p=" << p << " m=" << m << " lookahead=" << la;
        EXPECT_NO_THROW(check(z)) << "zb p=" << p << " m=" << m << " lookahead=" << la;
        Simulation sim = simulate(o);
        for (int r = 0; r < p; ++r) {
          // Forwards before the first backward: 1F1B's count plus the lookahead, but the last
          // rank's stays one (its backward follows its own forward).
          const auto& list = o.actions[static_cast<size_t>(r)];
          const auto firstB =
              std::find_if(list.begin(), list.end(), [](const Action& a) { return a.kind == K::Backward; });
          const int ahead = r < p - 1 ? p - r + la : 1;
          EXPECT_EQ(firstB - list.begin(), std::min(ahead, m)) << "p=" << p << " m=" << m << " rank " << r;
          EXPECT_EQ(sim.peakActivations[static_cast<size_t>(r)], std::min(ahead, m));
        }
        // With equal, steady costs running ahead changes nothing.
        EXPECT_NEAR(sim.bubble, static_cast<double>(p - 1) / (m + p - 1), 1e-12) << "p=" << p << " m=" << m;
        if (m % p != 0) continue;
        for (int v = 1; v <= 3; ++v) {
          EXPECT_NO_THROW(check(interleaved1F1B(p, v, m, la))) << "interleaved p=" << p << " v=" << v << " m=" << m;
        }
      }
  EXPECT_EQ(makeSchedule("1f1b", 3, 6, 0, 2).actions, oneFOneB(3, 6, 2).actions);
  try {
    makeSchedule("gpipe", 2, 4, 0, 1);
    FAIL() << "no error";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("gpipe runs every forward first; a lookahead (1) applies to 1f1b"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(oneFOneB(2, 4, -1), ScheduleError);
  EXPECT_THROW(makeSchedule("zb", 2, 4, 0, -2), ScheduleError);
}

TEST(Simulator, ALookaheadHidesTheTransfersBetweenRanks) {
  // Plain 1F1B on two ranks: rank 0's next forward waits for the gradient of its previous
  // micro-batch, so each round trip's latency lands on both ranks. One forward in reserve keeps
  // rank 1 fed.
  ActionCosts c;
  c.forward = {1.0};
  c.backward = {2.0};
  c.latency = 0.25;
  const int m = 8;
  const double plain = simulate(oneFOneB(2, m), c).makespan, ahead = simulate(oneFOneB(2, m, 1), c).makespan;
  // Rank 1 computes 3 per micro-batch and waits only for the first activation (1 + 0.25); then
  // rank 0's last backward follows the last gradient (0.25 + 2).
  EXPECT_DOUBLE_EQ(ahead, 1.25 + 3.0 * m + 2.25);
  // Without it every micro-batch between the first two and the last waits at least a transfer.
  EXPECT_GE(plain, ahead + 0.25 * (m - 2)) << "plain " << plain << ", with a lookahead " << ahead;
}

TEST(Simulator, CommunicationCostsDelayTheReceiver) {
  ActionCosts c;
  c.forward = {1.0};
  c.backward = {2.0};
  c.latency = 0.5;
  Simulation sim = simulate(gpipe(2, 1), c);
  // F0 on rank 0 [0,1], arrives 1.5, F0 on rank 1 [1.5,2.5], B [2.5,4.5], gradient at 5, B [5,7].
  EXPECT_DOUBLE_EQ(sim.makespan, 7.0);
  EXPECT_DOUBLE_EQ(sim.busy[0], 3.0);
}

TEST(Simulator, SendReceiveAndMicrobatchSizeCostsCount) {
  ActionCosts c;
  c.forward = {1.0};
  c.backward = {2.0};
  c.latency = 0.5;
  c.send = 0.25;  // keeps the sender busy
  c.recv = 0.125;
  // F0 [0,1], SF [1,1.25], arrives 1.75, RF [1.75,1.875], F0 [1.875,2.875], B [2.875,4.875],
  // SB [4.875,5.125], arrives 5.625, RB [5.625,5.75], B [5.75,7.75].
  Simulation sim = simulate(gpipe(2, 1), c);
  EXPECT_DOUBLE_EQ(sim.makespan, 7.75);
  EXPECT_DOUBLE_EQ(sim.busy[0], 3.0);  // sends and receives are not compute
  // A micro-batch half the size costs half in every compute action (not in its transfers).
  c.microbatchScale = {1.0, 0.5};
  sim = simulate(gpipe(2, 2), c);
  EXPECT_DOUBLE_EQ(sim.busy[0], 3.0 + 1.5);
  EXPECT_DOUBLE_EQ(sim.busy[1], 4.5);
  // One factor per micro-batch, finite and non-negative.
  c.microbatchScale = {1.0};
  EXPECT_THROW(simulate(gpipe(2, 2), c), ValueError);
  c.microbatchScale = {1.0, -1.0};
  EXPECT_THROW(simulate(gpipe(2, 2), c), ValueError);
}

TEST(SplitTail, TheLastGradientLeavesAWeightBackwardEarlier) {
  // 1F1B on two ranks, unit costs (F 1, B 2, I 1, W 1): rank 0's last backward waits for rank
  // 1's [11, 13]; split, rank 1 hands the gradient on at 12 and runs W3 while rank 0 computes.
  Schedule base = oneFOneB(2, 4), split = splitTail(base, 1);
  EXPECT_EQ(split.name, "1f1b+split1");
  EXPECT_EQ(split.actions[0], base.actions[0]);  // the first stage's input gradient is nobody's wait
  const std::vector<Action> rank1{{K::Forward, 1, 0},  {K::Backward, 1, 0},      {K::Forward, 1, 1},
                                  {K::Backward, 1, 1}, {K::Forward, 1, 2},       {K::Backward, 1, 2},
                                  {K::Forward, 1, 3},  {K::BackwardInput, 1, 3}, {K::BackwardWeight, 1, 3}};
  EXPECT_EQ(split.actions[1], rank1);
  EXPECT_DOUBLE_EQ(simulate(base).makespan, 15.0);
  EXPECT_DOUBLE_EQ(simulate(split).makespan, 14.0);
  EXPECT_EQ(splitTail(base, 0).actions, base.actions);
}

TEST(SplitTail, KeepsEveryScheduleValidInOrderAndNeverSlowerWithUnitCosts) {
  for (const char* name : {"gpipe", "1f1b", "interleaved", "v", "zb"})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 9; ++m)
        for (int la = 0; la <= 1; ++la) {
          if ((std::string(name) == "interleaved" && m % p != 0) || (std::string(name) == "gpipe" && la > 0)) continue;
          const Schedule base = makeSchedule(name, p, m, 0, la);
          const double before = simulate(base).makespan;
          for (int k = 0; k <= m; ++k) {
            const std::string what = fmt::format("{} p={} m={} lookahead={} k={}", name, p, m, la, k);
            Schedule s;
            ASSERT_NO_THROW(s = splitTail(base, k)) << what;
            EXPECT_NO_THROW(check(s)) << what;
            // With I + W = B, a postponed W only fills waits: the step never gets longer.
            EXPECT_LE(simulate(s).makespan, before + 1e-9) << what;
            for (int r = 0; r < p; ++r) {
              // Each rank's F, B and I keep their order; the split ones are exactly the last k
              // micro-batches' backwards on every stage but the first.
              std::vector<Action> order;
              for (Action a : s.actions[static_cast<size_t>(r)]) {
                const bool tail = a.stage > 0 && a.microbatch >= m - k;
                if (!base.splitsBackward()) {
                  if (a.kind == K::BackwardWeight) continue;
                  if (a.kind == K::Backward) {
                    EXPECT_FALSE(tail) << what << ": " << a.str() << " not split";
                  }
                  if (a.kind == K::BackwardInput) {
                    EXPECT_TRUE(tail) << what << ": " << a.str();
                    a.kind = K::Backward;
                  }
                }
                order.push_back(a);
              }
              if (!base.splitsBackward()) {
                EXPECT_EQ(order, base.actions[static_cast<size_t>(r)]) << what;
              }
            }
          }
        }
}

TEST(SplitTail, FillsTheInterleavedCooldownWithMeasuredCosts) {
  // The per-stage times bench/pipeline measured for the GPT in four chunks on two ranks (ms),
  // the split halves about 5% dearer than a full backward: splitting the last two micro-batches
  // takes the step from 74.5 to 72.7 ms, and splitting all of them costs more than it saves.
  ActionCosts c;
  c.forward = {1.51, 1.49, 1.44, 1.59};
  c.backward = {2.71, 2.70, 2.69, 2.77};
  c.backwardInput = {0.04, 1.67, 1.67, 1.72};
  c.backwardWeight = {2.71, 1.30, 1.30, 1.34};
  c.send = 0.055;
  c.latency = 0.088;
  const Schedule base = interleaved1F1B(2, 2, 8);
  const double plain = simulate(base, c).makespan, two = simulate(splitTail(base, 2, c), c).makespan,
               all = simulate(splitTail(base, 8, c), c).makespan;
  EXPECT_NEAR(plain, 74.5, 0.1);
  EXPECT_LT(two, plain - 1.5);
  EXPECT_GT(all, two);
}

TEST(SplitTail, RefusesWhatItCannotSplit) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const ScheduleError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { splitTail(oneFOneB(2, 4), 5); }),
            "splitTail: cannot split the backwards of the last 5 micro-batches of schedule '1f1b', which has 4 (0..4)");
  EXPECT_NE(message([] { splitTail(oneFOneB(2, 4), -1); }).find("last -1 micro-batches"), std::string::npos);
  EXPECT_NE(message([] {
              splitTail(withCommunication(oneFOneB(2, 4)), 1);
            }).find("schedule '1f1b' has its sends and receives already"),
            std::string::npos);
  Schedule broken = oneFOneB(2, 2);
  broken.actions[1].pop_back();  // rank 1 never runs its last backward
  EXPECT_NE(message([&] { splitTail(broken, 1); }).find("never runs the backward"), std::string::npos);
  ActionCosts c;
  c.microbatchScale = {1.0};  // one factor for four micro-batches
  EXPECT_THROW(splitTail(oneFOneB(2, 4), 1, c), ValueError);
}

TEST(Timeline, TextAndSvg) {
  Simulation sim = simulate(oneFOneB(2, 2));  // F = 1, B = 2
  EXPECT_EQ(formatTimeline(sim), "rank  0 | F0 F1 .  .  B0    .  B1\n"
                                 "rank  1 | .  F0 B0    F1 B1    .  .\n");
  std::string svg = timelineSvg(sim, "1f1b");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find(">B1</text>"), std::string::npos);
}

}  // namespace
}  // namespace cohort::pipeline
