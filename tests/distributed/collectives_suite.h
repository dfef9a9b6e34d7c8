// The backend-neutral collectives suite, written once: a test binary includes this header and
// instantiates `Collectives` with (backend name, world size) pairs, e.g.
//   INSTANTIATE_TEST_SUITE_P(Gloo, Collectives, Combine(Values("gloo"), Values(1, 2, 3, 4, 5)),
//                            collectivesParamName);
// Each test body runs on a World (tests/harness/world.h): ranks as threads of this process meeting
// through one HashStore, or, for a backend that registered its own world (mpi_test.cc: "mpi"),
// this process's one rank of an `mpirun -np N` job. Every rank's data is a function of
// (rank, index); the expected result is computed locally in double and cast to the dtype, then
// compared element by element.
#pragma once

#include "distributed/pg_test_util.h"

namespace cohort::dist::testing {

// ---- the suite -----------------------------------------------------------------------------

using CollectivesParam = std::tuple<std::string, int>;

inline std::string collectivesParamName(const ::testing::TestParamInfo<CollectivesParam>& info) {
  return fmt::format("{}_world{}", std::get<0>(info.param), std::get<1>(info.param));
}

class Collectives : public ::testing::TestWithParam<CollectivesParam> {
 protected:
  void SetUp() override { world_ = makeWorld(std::get<0>(GetParam()), std::get<1>(GetParam())); }
  void TearDown() override { world_.reset(); }
  int size() const { return std::get<1>(GetParam()); }
  std::unique_ptr<World> world_;
};

TEST_P(Collectives, AllreduceEveryDtypeOpAndCount) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (int64_t count : kCounts) {
          Tensor t = filled(d, count, [&](int64_t i) { return value(d, op, r, i); });
          if (op == ReduceOp::Avg && !isFloating(d)) {
            EXPECT_THROW(pg.allreduce(t, {.op = op}), ValueError);
            continue;
          }
          pg.allreduce(t, {.op = op})->wait();
          std::string mm = mismatch(t, count, [&](int64_t i) { return reduceRef(d, op, n, i); });
          if (!mm.empty())
            throw std::runtime_error(
                fmt::format("allreduce {} {} n={}: {}", dtypeName(d), reduceOpName(op), count, mm));
        }
      }
    }
  });
}

TEST_P(Collectives, AllreduceLarge) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (op == ReduceOp::Avg && !isFloating(d)) continue;
        Tensor t = filled(d, kLargeCount, periodic([&](int64_t i) { return value(d, op, r, i); }));
        pg.allreduce(t, {.op = op})->wait();
        std::string mm = mismatch(t, kLargeCount, periodic([&](int64_t i) { return reduceRef(d, op, n, i); }));
        if (!mm.empty())
          throw std::runtime_error(fmt::format("allreduce {} {} large: {}", dtypeName(d), reduceOpName(op), mm));
      }
    }
  });
}

// Every other op past a million elements, in every dtype, broadcast and reduce at every root (the
// per-rank share of a gathered or scattered tensor is kLargeCount / size, so the whole tensor
// stays about kLargeCount).
TEST_P(Collectives, EveryOpLarge) {
  const int n = size();
  const int64_t share = kLargeCount / n + 1;
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (DType d : kAllDTypes) {
      auto f = [&](int src) {
        return periodic([&, src](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, src, i)); });
      };
      // Broadcast and reduce at every root: a backend's large-message path (pipelined, chunked or
      // segmented) must not depend on the root being rank 0.
      for (int root = 0; root < n; ++root) {
        Tensor t = filled(d, kLargeCount, f(r));
        pg.broadcast(t, {.root = root})->wait();
        COHORT_EXPECT_MATCH(t, kLargeCount, f(root));

        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Avg}) {
          if (op == ReduceOp::Avg && !isFloating(d)) continue;
          Tensor u = filled(d, kLargeCount, periodic([&](int64_t i) { return value(d, op, r, i); }));
          pg.reduce(u, {.op = op, .root = root})->wait();
          if (r == root)
            COHORT_EXPECT_MATCH(u, kLargeCount, periodic([&](int64_t i) { return reduceRef(d, op, n, i); }));
        }
      }
      for (ReduceOp op : kAllReduceOps) {
        if (op == ReduceOp::Avg && !isFloating(d)) continue;
        Tensor flat = filled(d, share * n, periodic([&](int64_t i) { return value(d, op, r, i); }));
        Tensor out = zeros({share}, TensorOptions{.dtype = d});
        pg.reduceScatterTensor(out, flat, {.op = op})->wait();
        COHORT_EXPECT_MATCH(out, share, periodic([&](int64_t i) { return reduceRef(d, op, n, r * share + i); }));
      }

      Tensor mine = filled(d, share, f(r));
      Tensor all = zeros({n * share}, TensorOptions{.dtype = d});
      pg.allgatherIntoTensor(all, mine)->wait();
      for (int k = 0; k < n; ++k) COHORT_EXPECT_MATCH(all.narrow(0, k * share, share).contiguous(), share, f(k));

      // Block k of rank r's input goes to rank k.
      Tensor in = filled(d, n * share, f(r));
      Tensor got = zeros({n * share}, TensorOptions{.dtype = d});
      pg.alltoall(got, in)->wait();
      std::vector<std::function<double(int64_t)>> from;
      for (int k = 0; k < n; ++k) from.push_back(f(k));
      COHORT_EXPECT_MATCH(got, n * share, [&](int64_t i) { return from[i / share](r * share + i % share); });

      if (n > 1) {
        Tensor out = filled(d, kLargeCount, periodic([&](int64_t i) { return value(d, ReduceOp::Sum, r, i + 5); }));
        Tensor back = zeros({kLargeCount}, TensorOptions{.dtype = d});
        auto s = pg.send(out, next, {.tag = 7});
        auto rv = pg.recv(back, prev, {.tag = 7});
        s->wait();
        rv->wait();
        COHORT_EXPECT_MATCH(back, kLargeCount,
                            periodic([&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, prev, i + 5)); }));
      }
    }
  });
}

TEST_P(Collectives, AllreduceCoalesced) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
        if (op == ReduceOp::Avg && !isFloating(d)) continue;
        // Tensors that continue one index sequence, so the reference is the same function.
        std::vector<int64_t> counts = {7, 0, 1000, 1};
        std::vector<Tensor> ts;
        int64_t base = 0;
        for (int64_t c : counts) {
          ts.push_back(filled(d, c, [&](int64_t i) { return value(d, op, r, base + i); }));
          base += c;
        }
        ts[2] = ts[2].view({10, 100});
        pg.allreduceCoalesced(ts, {.op = op})->wait();
        base = 0;
        for (size_t k = 0; k < ts.size(); ++k) {
          COHORT_EXPECT_MATCH(ts[k].reshape({-1}), counts[k], [&](int64_t i) { return reduceRef(d, op, n, base + i); });
          base += counts[k];
        }
      }
    }
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (int root = 0; root < n; ++root) {
      for (DType d : kAllDTypes) {
        for (int64_t count : kCounts) {
          Tensor t = filled(d, count, [&](int64_t i) { return value(d, ReduceOp::Sum, r, i); });
          pg.broadcast(t, {.root = root})->wait();
          COHORT_EXPECT_MATCH(t, count, [&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, root, i)); });
        }
      }
    }
  });
}

TEST_P(Collectives, ReduceToEveryRoot) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (int root = 0; root < n; ++root) {
      for (DType d : kAllDTypes) {
        for (ReduceOp op : kAllReduceOps) {
          if (op == ReduceOp::Avg && !isFloating(d)) continue;
          for (int64_t count : kCounts) {
            Tensor t = filled(d, count, [&](int64_t i) { return value(d, op, r, i); });
            pg.reduce(t, {.op = op, .root = root})->wait();
            if (r == root) COHORT_EXPECT_MATCH(t, count, [&](int64_t i) { return reduceRef(d, op, n, i); });
          }
        }
      }
    }
  });
}

TEST_P(Collectives, AllgatherListTensorAndCoalesced) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (int64_t count : kCounts) {
        auto f = [&](int src) { return [&, src](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, src, i)); }; };
        Tensor in = filled(d, count, f(r));
        std::vector<Tensor> outs;
        for (int k = 0; k < n; ++k) outs.push_back(full({count}, -3, TensorOptions{.dtype = d}));
        pg.allgather(outs, in)->wait();
        for (int k = 0; k < n; ++k) COHORT_EXPECT_MATCH(outs[k], count, f(k));

        Tensor all = empty({n, count}, TensorOptions{.dtype = d});
        pg.allgatherIntoTensor(all, in)->wait();
        for (int k = 0; k < n; ++k) COHORT_EXPECT_MATCH(all.select(0, k).contiguous(), count, f(k));

        // FSDP's layout: the input is this rank's slice of the output.
        Tensor whole = zeros({n * count}, TensorOptions{.dtype = d});
        Tensor mine = whole.narrow(0, r * count, count);
        mine.copy_(in);
        pg.allgatherIntoTensor(whole, mine)->wait();
        for (int k = 0; k < n; ++k) COHORT_EXPECT_MATCH(whole.narrow(0, k * count, count).contiguous(), count, f(k));
      }
      // Coalesced: inputs of different sizes, one of them empty.
      const std::vector<int64_t> sizes = {7, 0, 1000};
      auto g = [&](int src, size_t t) {
        return [&, src, t](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, src, 2000 * t + i)); };
      };
      std::vector<Tensor> ins;
      for (size_t t = 0; t < sizes.size(); ++t) ins.push_back(filled(d, sizes[t], g(r, t)));
      std::vector<std::vector<Tensor>> outs(n);
      for (int k = 0; k < n; ++k)
        for (int64_t c : sizes) outs[k].push_back(zeros({c}, TensorOptions{.dtype = d}));
      pg.allgatherCoalesced(outs, ins)->wait();
      for (int k = 0; k < n; ++k)
        for (size_t t = 0; t < sizes.size(); ++t) COHORT_EXPECT_MATCH(outs[k][t], sizes[t], g(k, t));
    }
  });
}

TEST_P(Collectives, ReduceScatterListAndTensor) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (op == ReduceOp::Avg && !isFloating(d)) continue;
        for (int64_t count : kCounts) {
          // Rank r's data for destination k at element i is value(rank, k * count + i).
          std::vector<Tensor> ins;
          for (int k = 0; k < n; ++k)
            ins.push_back(filled(d, count, [&](int64_t i) { return value(d, op, r, k * count + i); }));
          Tensor out = zeros({count}, TensorOptions{.dtype = d});
          pg.reduceScatter(out, ins, {.op = op})->wait();
          auto expect = [&](int64_t i) { return reduceRef(d, op, n, r * count + i); };
          std::string mm = mismatch(out, count, expect);
          if (!mm.empty())
            throw std::runtime_error(
                fmt::format("reduce_scatter {} {} n={}: {}", dtypeName(d), reduceOpName(op), count, mm));

          Tensor flat = filled(d, count * n, [&](int64_t i) { return value(d, op, r, i); });
          Tensor out2 = zeros({count}, TensorOptions{.dtype = d});
          pg.reduceScatterTensor(out2, flat, {.op = op})->wait();
          COHORT_EXPECT_MATCH(out2, count, expect);
        }
      }
    }
  });
}

TEST_P(Collectives, AlltoallEqualAndUneven) {
  const int n = size();
  // Element (src, dst, row, col) encoded in one number: exact where the dtype holds it, else the
  // dtype's own per-rank data (value()) at an index made of (dst, row, col).
  auto code = [](DType d, int src, int dst, int64_t row, int64_t col) {
    if (d == DType::Float32 || d == DType::Float64 || d == DType::Int64 || d == DType::Int32)
      return static_cast<double>(src * 1000 + dst * 100 + row * 3 + col);
    return roundTo(d, value(d, ReduceOp::Sum, src, dst * 5000 + row * 3 + col));
  };
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      for (int64_t per : {0, 1, 4, 334}) {  // rows per destination, width 3
        Tensor in = filled(d, n * per * 3, [&](int64_t i) {
          int64_t row = i / 3;
          return code(d, r, static_cast<int>(row / per), row % per, i % 3);
        });
        in = in.view({n * per, 3});
        Tensor out = zeros({n * per, 3}, TensorOptions{.dtype = d});
        pg.alltoall(out, in)->wait();
        COHORT_EXPECT_MATCH(out.reshape({-1}), n * per * 3, [&](int64_t i) {
          int64_t row = i / 3;
          return code(d, static_cast<int>(row / per), r, row % per, i % 3);
        });
      }
      // Uneven: rank s sends (s + t) % 3 rows to rank t.
      auto rows = [](int s, int t) { return static_cast<int64_t>((s + t) % 3); };
      std::vector<int64_t> inSplits, outSplits;
      for (int t = 0; t < n; ++t) {
        inSplits.push_back(rows(r, t));
        outSplits.push_back(rows(t, r));
      }
      int64_t inRows = 0, outRows = 0;
      for (int t = 0; t < n; ++t) inRows += inSplits[t], outRows += outSplits[t];
      std::vector<double> inVals, outVals;
      for (int t = 0; t < n; ++t)
        for (int64_t row = 0; row < inSplits[t]; ++row)
          for (int c = 0; c < 3; ++c) inVals.push_back(code(d, r, t, row, c));
      for (int s = 0; s < n; ++s)
        for (int64_t row = 0; row < outSplits[s]; ++row)
          for (int c = 0; c < 3; ++c) outVals.push_back(code(d, s, r, row, c));
      Tensor in = filled(d, inRows * 3, [&](int64_t i) { return inVals[i]; }).view({inRows, 3});
      Tensor out = zeros({outRows, 3}, TensorOptions{.dtype = d});
      AlltoallOptions o;
      o.inputSplitSizes = inSplits;
      o.outputSplitSizes = outSplits;
      pg.alltoall(out, in, o)->wait();
      COHORT_EXPECT_MATCH(out.reshape({-1}), outRows * 3, [&](int64_t i) { return outVals[i]; });
    }
  });
}

TEST_P(Collectives, AlltoallList) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (DType d : kAllDTypes) {
      std::vector<Tensor> ins, outs;
      auto len = [](int s, int t) { return static_cast<int64_t>((s + 2 * t) % 4); };  // 0..3 elements
      auto val = [&](int s, int t, int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, s, t * 10 + i)); };
      for (int t = 0; t < n; ++t) {
        ins.push_back(filled(d, len(r, t), [&](int64_t i) { return val(r, t, i); }));
        outs.push_back(zeros({len(t, r)}, TensorOptions{.dtype = d}));
      }
      pg.alltoallList(outs, ins)->wait();
      for (int s = 0; s < n; ++s) COHORT_EXPECT_MATCH(outs[s], len(s, r), [&](int64_t i) { return val(s, r, i); });
    }
  });
}

TEST_P(Collectives, GatherAndScatterEveryRoot) {
  const int n = size();
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    for (int root = 0; root < n; ++root) {
      for (DType d : kAllDTypes) {
        for (int64_t count : {int64_t(0), int64_t(7), int64_t(1000)}) {
          auto f = [&](int src) { return [&, src](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, src, i)); }; };
          Tensor in = filled(d, count, f(r));
          std::vector<Tensor> outs;
          if (r == root)
            for (int k = 0; k < n; ++k) outs.push_back(zeros({count}, TensorOptions{.dtype = d}));
          pg.gather(outs, in, {.root = root})->wait();
          if (r == root)
            for (int k = 0; k < n; ++k) COHORT_EXPECT_MATCH(outs[k], count, f(k));

          std::vector<Tensor> pieces;
          if (r == root)
            for (int k = 0; k < n; ++k)
              pieces.push_back(filled(d, count, [&](int64_t i) { return value(d, ReduceOp::Sum, k, i + 5); }));
          Tensor out = zeros({count}, TensorOptions{.dtype = d});
          pg.scatter(out, pieces, {.root = root})->wait();
          COHORT_EXPECT_MATCH(out, count, [&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, r, i + 5)); });
        }
      }
    }
  });
}

TEST_P(Collectives, BarrierAndSequenceNumbers) {
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    uint64_t before = pg.sequenceNumber();
    for (int k = 0; k < 5; ++k) pg.barrier()->wait();
    EXPECT_EQ(pg.sequenceNumber(), before + 5);
    auto w = pg.barrier();
    EXPECT_EQ(w->sequenceNumber(), before + 6);
    w->wait();
    EXPECT_TRUE(w->isCompleted());
    EXPECT_TRUE(w->isSuccess());
    // Ops issued back to back complete in order, and each Work carries its op's outputs.
    std::vector<Tensor> ts;
    std::vector<WorkPtr> works;
    for (int k = 0; k < 20; ++k) {
      ts.push_back(full({5}, k, TensorOptions{.dtype = DType::Float32}));
      works.push_back(pg.allreduce(ts.back()));
    }
    for (int k = 0; k < 20; ++k) {
      works[k]->wait();
      ASSERT_EQ(works[k]->result().size(), 1u);
      EXPECT_TRUE(works[k]->result()[0].isSameAs(ts[k]));
      COHORT_EXPECT_MATCH(ts[k], 5, [&](int64_t) { return static_cast<double>(k * world_->size()); });
    }
  });
}

TEST_P(Collectives, TaggedSendRecv) {
  const int n = size();
  if (n < 2) GTEST_SKIP() << "send/recv needs two ranks";
  const std::string& backend = std::get<0>(GetParam());
  if (backend == "fake" || backend == "nccl") {
    GTEST_SKIP() << backend << " does not send tags (as NCCL): messages between two ranks match in issue order";
  }
  world_->run([&](int r) {
    auto& pg = world_->pg(r);
    uint64_t seqBefore = pg.sequenceNumber();
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (DType d : kAllDTypes) {
      // Two messages to the next rank with different tags, received in the opposite order.
      Tensor a = filled(d, 7, [&](int64_t i) { return value(d, ReduceOp::Sum, r, i); });
      Tensor b = filled(d, 1000, [&](int64_t i) { return value(d, ReduceOp::Sum, r, i + 50); });
      auto s1 = pg.send(a, next, {.tag = 1});
      auto s2 = pg.send(b, next, {.tag = 2});
      Tensor gotB = zeros({1000}, TensorOptions{.dtype = d});
      Tensor gotA = zeros({7}, TensorOptions{.dtype = d});
      auto r2 = pg.recv(gotB, prev, {.tag = 2});
      auto r1 = pg.recv(gotA, prev, {.tag = 1});
      r2->wait();
      r1->wait();
      s1->wait();
      s2->wait();
      COHORT_EXPECT_MATCH(gotA, 7, [&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, prev, i)); });
      COHORT_EXPECT_MATCH(gotB, 1000, [&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, prev, i + 50)); });
      // A ring at every count: every rank sends first, then receives.
      for (int64_t count : kCounts) {
        Tensor out = filled(d, count, [&](int64_t i) { return value(d, ReduceOp::Sum, r, i + 5); });
        Tensor in = zeros({count}, TensorOptions{.dtype = d});
        auto s = pg.send(out, next, {.tag = 7});
        auto rv = pg.recv(in, prev, {.tag = 7});
        s->wait();
        rv->wait();
        COHORT_EXPECT_MATCH(in, count, [&](int64_t i) { return roundTo(d, value(d, ReduceOp::Sum, prev, i + 5)); });
      }
    }
    EXPECT_EQ(pg.sequenceNumber(), seqBefore) << "send/recv must not take collective sequence numbers";
  });
}

TEST_P(Collectives, SubgroupsRunConcurrentlyWithTheWorld) {
  const int n = size();
  world_->run([&](int r) {
    auto& world = world_->pg(r);
    // Split into even and odd ranks, ordered by descending rank.
    auto parity = world.split(r % 2, -r);
    ASSERT_NE(parity, nullptr);
    std::vector<int> members;
    for (int k = n - 1; k >= 0; --k)
      if (k % 2 == r % 2) members.push_back(k);
    ASSERT_EQ(parity->size(), static_cast<int>(members.size()));
    EXPECT_EQ(parity->globalRanks(), members);
    EXPECT_EQ(members[parity->rank()], r);
    // A newGroup of every rank but 0 (when there is more than one rank).
    std::vector<int> tail;
    for (int k = (n > 1 ? 1 : 0); k < n; ++k) tail.push_back(k);
    auto tailGroup = world.newGroup(tail);
    EXPECT_EQ(tailGroup == nullptr, n > 1 && r == 0);

    // The world and the subgroups run collectives at the same time, from different threads.
    constexpr int kRounds = 20;
    std::string subError;
    std::thread sub([&] {
      try {
        for (int k = 0; k < kRounds; ++k) {
          Tensor t =
              filled(DType::Float32, 1000, [&](int64_t i) { return value(DType::Float32, ReduceOp::Sum, r, i + k); });
          parity->allreduce(t)->wait();
          COHORT_EXPECT_MATCH(t, 1000, [&](int64_t i) {
            double s = 0;
            for (int m : members) s += value(DType::Float32, ReduceOp::Sum, m, i + k);
            return s;
          });
          if (tailGroup) {
            Tensor u = filled(DType::Int64, 7, [&](int64_t i) { return value(DType::Int64, ReduceOp::Max, r, i + k); });
            tailGroup->allreduce(u, {.op = ReduceOp::Max})->wait();
            COHORT_EXPECT_MATCH(u, 7,
                                [&](int64_t i) { return reduceRef(DType::Int64, ReduceOp::Max, n, i + k, tail); });
          }
        }
      } catch (const std::exception& e) {
        subError = e.what();
      }
    });
    for (int k = 0; k < kRounds; ++k) {
      Tensor t = filled(DType::Float64, 7, [&](int64_t i) { return value(DType::Float64, ReduceOp::Sum, r, i + k); });
      world.allreduce(t)->wait();
      COHORT_EXPECT_MATCH(t, 7, [&](int64_t i) { return reduceRef(DType::Float64, ReduceOp::Sum, n, i + k); });
    }
    sub.join();
    if (!subError.empty()) throw std::runtime_error("subgroup: " + subError);
    EXPECT_EQ(parity->sequenceNumber(), static_cast<uint64_t>(kRounds));
    // Group ranks, not world ranks, address roots in a subgroup.
    Tensor d = full({3}, r, TensorOptions{.dtype = DType::Int32});
    parity->broadcast(d, {.root = parity->size() - 1})->wait();
    COHORT_EXPECT_MATCH(d, 3, [&](int64_t) { return static_cast<double>(members.back()); });
    // Tear the subgroups down together (a backend may talk to its peers while closing).
    world.barrier()->wait();
  });
}

}  // namespace cohort::dist::testing
