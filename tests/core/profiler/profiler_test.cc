// The profiler: exact per-op memory on a hand-built graph, times that nest, shapes, backward linked
// to forward, the table, the Chrome trace, the step ring, the memory timeline, and training that
// is bit-identical with the profiler on and off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/adam.h>
#include <cohort/core/profiler/profiler.h>

#include "core/test_util.h"

namespace cohort {
namespace {

using profiler::Event;
using profiler::EventKind;
using profiler::Profile;

const Event* findEvent(const std::vector<Event>& ev, const std::string& name, int nth = 0) {
  for (const Event& e : ev)
    if (e.name == name && nth-- == 0) return &e;
  return nullptr;
}

std::string tempPath(const std::string& name) {
  return fmt::format("{}/cohort_profiler_{}_{}", ::testing::TempDir(), getpid(), name);
}

// What Perfetto's JSON importer (ui.perfetto.dev) needs beyond valid JSON and UTF-8 (which
// nlohmann's parser checks): no raw DEL in a string (older versions reject the file); no tid 0
// (it files tid 0 under tid == pid, another thread's track); complete events of one (pid, tid) that
// nest or are disjoint (one that partly overlaps another is set aside, or dropped by older
// versions); each flow (id, cat, name) started once and no later than its ends (it reads events in
// ts order and drops an end whose start it has not seen), both ends at the start of a complete
// event of their track (the span the flow binds to).
void expectPerfettoReadsIt(const std::string& text) {
  EXPECT_EQ(text.find('\x7f'), std::string::npos);
  nlohmann::json t = nlohmann::json::parse(text);
  using Track = std::pair<int64_t, int64_t>;
  using FlowKey = std::tuple<uint64_t, std::string, std::string>;
  auto ns = [](const nlohmann::json& us) { return std::llround(us.get<double>() * 1e3); };
  std::map<Track, std::vector<std::pair<int64_t, int64_t>>> spans;  // start, end
  std::map<FlowKey, int64_t> flowStarts;
  std::vector<std::pair<FlowKey, int64_t>> flowEnds;
  std::vector<std::pair<Track, int64_t>> flowPoints;
  for (const auto& e : t.at("traceEvents")) {
    const std::string ph = e.at("ph");
    const bool processWide = ph == "C" || (ph == "M" && e["name"] != "thread_name" && e["name"] != "thread_sort_index");
    if (!processWide) {
      EXPECT_TRUE(e.at("tid").is_number_integer()) << e;
      EXPECT_GT(e.at("tid").get<int64_t>(), 0) << e;
    }
    const Track track{e.at("pid").get<int64_t>(), e.value("tid", int64_t{0})};
    if (ph == "X") {
      spans[track].emplace_back(ns(e.at("ts")), ns(e.at("ts")) + ns(e.at("dur")));
    } else if (ph == "s" || ph == "f") {
      const FlowKey key{e.at("id").get<uint64_t>(), e.at("cat"), e.at("name")};
      flowPoints.emplace_back(track, ns(e.at("ts")));
      if (ph == "s") EXPECT_TRUE(flowStarts.emplace(key, ns(e.at("ts"))).second) << "flow started twice: " << e;
      else flowEnds.emplace_back(key, ns(e.at("ts")));
    }
  }
  for (const auto& [key, ts] : flowEnds) {
    auto it = flowStarts.find(key);
    ASSERT_NE(it, flowStarts.end()) << "flow " << std::get<0>(key) << " ends without a start";
    EXPECT_LE(it->second, ts) << "flow " << std::get<0>(key) << " ends before it starts";
  }
  std::map<Track, std::set<int64_t>> spanStarts;
  for (auto& [track, v] : spans) {
    std::sort(v.begin(), v.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<int64_t> open;  // ends of the spans enclosing the next one, innermost last
    for (auto [start, end] : v) {
      spanStarts[track].insert(start);
      while (!open.empty() && open.back() <= start) open.pop_back();
      EXPECT_TRUE(open.empty() || open.back() >= end)
          << "spans partly overlap on pid " << track.first << " tid " << track.second << " at " << start;
      open.push_back(end);
    }
  }
  for (const auto& [track, ts] : flowPoints)
    EXPECT_TRUE(spanStarts[track].count(ts)) << "flow at " << ts << " binds no span";
}

TEST(Profiler, SelfAndTotalBytesPerOpAreExact) {
  Profile prof({.memory = true});
  {
    profiler::Range outer("outer");
    Tensor a = zeros({256});  // 1024 bytes, allocated inside full (zeros -> full)
    {
      profiler::Range inner("inner");
      Tensor b = ones({64});  // 256 bytes, freed while "inner" is the innermost span
    }
    a = Tensor();  // 1024 bytes freed by "outer" itself
  }
  prof.stop();
  const auto& ev = prof.events();
  const Event* outer = findEvent(ev, "outer");
  const Event* inner = findEvent(ev, "inner");
  const Event* zerosEv = findEvent(ev, "zeros");
  const Event* full0 = findEvent(ev, "full", 0);
  const Event* full1 = findEvent(ev, "full", 1);
  ASSERT_TRUE(outer && inner && zerosEv && full0 && full1);
  EXPECT_EQ(full0->allocBytes, 1024);
  EXPECT_EQ(full0->freedBytes, 0);
  EXPECT_EQ(zerosEv->allocBytes, 0);
  EXPECT_EQ(zerosEv->totalAllocBytes, 1024);
  EXPECT_EQ(full1->allocBytes, 256);
  EXPECT_EQ(inner->allocBytes, 0);
  EXPECT_EQ(inner->freedBytes, 256);
  EXPECT_EQ(inner->totalAllocBytes, 256);
  EXPECT_EQ(inner->totalFreedBytes, 256);
  EXPECT_EQ(outer->allocBytes, 0);
  EXPECT_EQ(outer->freedBytes, 1024);
  EXPECT_EQ(outer->totalAllocBytes, 1280);
  EXPECT_EQ(outer->totalFreedBytes, 1280);
  // Parents: zeros in outer, full in zeros; the second full (ones) in inner.
  EXPECT_EQ(&ev[static_cast<size_t>(zerosEv->parent)], outer);
  EXPECT_EQ(&ev[static_cast<size_t>(full0->parent)], zerosEv);
  EXPECT_EQ(findEvent(ev, "ones")->parent, inner - ev.data());

  // The table adds the same bytes up: "full" twice, 1280 bytes self; "outer" -1024 self, 0 total.
  std::map<std::string, profiler::OpStats> rows;
  for (const auto& r : prof.keyAverages()) rows[r.name] = r;
  EXPECT_EQ(rows["full"].calls, 2);
  EXPECT_EQ(rows["full"].selfMemBytes, 1280);
  EXPECT_EQ(rows["outer"].selfMemBytes, -1024);
  EXPECT_EQ(rows["outer"].totalMemBytes, 0);
  EXPECT_EQ(rows["inner"].totalMemBytes, 0);
  const std::string table = prof.table({.sortBy = profiler::SortBy::SelfMemory});
  EXPECT_NE(table.find("Self CPU Mem"), std::string::npos) << table;
  EXPECT_NE(table.find("1.25 Kb"), std::string::npos) << table;   // full's 1280 bytes
  EXPECT_NE(table.find("-1.00 Kb"), std::string::npos) << table;  // outer's self
  // Sorted by self memory: full's row comes before outer's.
  EXPECT_LT(table.find("full"), table.find("outer")) << table;
}

TEST(Profiler, TimesNestAndAddUp) {
  Profile prof;
  Tensor x = randn({64, 64}), w = randn({64, 64}, {.requiresGrad = true});
  for (int i = 0; i < 3; ++i) {
    profiler::Range r("iteration");
    Tensor y = nn::functional::softmax(matmul(x, w).relu(), 1).sum();
    y.backward();
  }
  const auto& ev = prof.events();
  ASSERT_GT(ev.size(), 10u);
  std::vector<int64_t> childNs(ev.size(), 0);
  for (const Event& e : ev) {
    EXPECT_GT(e.endNs, e.startNs) << e.name;
    if (e.parent < 0) continue;
    const Event& p = ev[static_cast<size_t>(e.parent)];
    EXPECT_GE(e.startNs, p.startNs) << e.name << " in " << p.name;
    EXPECT_LE(e.endNs, p.endNs) << e.name << " in " << p.name;
    EXPECT_EQ(e.thread, p.thread);
    EXPECT_EQ(e.depth, p.depth + 1);
    childNs[static_cast<size_t>(e.parent)] += e.durationNs();
  }
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_LE(childNs[i], ev[i].durationNs()) << ev[i].name;
  for (const auto& r : prof.keyAverages()) {
    EXPECT_LE(r.selfNs, r.totalNs) << r.name;
    EXPECT_GE(r.selfNs, 0) << r.name;
  }
  std::map<std::string, int64_t> calls;
  for (const auto& r : prof.keyAverages()) calls[r.name] = r.calls;
  EXPECT_EQ(calls["iteration"], 3);
  EXPECT_EQ(calls["matmul"], 3);
  EXPECT_EQ(calls["softmax"], 3);
}

TEST(Profiler, ShapesAndDtypesOfInputs) {
  Profile prof({.shapes = true});
  Tensor a = ones({2, 3}), b = ones({3, 4}, {.dtype = DType::Float64});
  (void)mm(a, b.to(DType::Float32));
  (void)add(a, 1.5);
  const Event* mmEv = findEvent(prof.events(), "mm");
  ASSERT_NE(mmEv, nullptr);
  EXPECT_EQ(mmEv->shapes, "[[2, 3], [3, 4]]");
  EXPECT_EQ(mmEv->dtypes, "[float32, float32]");
  const Event* addEv = findEvent(prof.events(), "add");
  ASSERT_NE(addEv, nullptr);
  EXPECT_EQ(addEv->shapes, "[[2, 3], []]");
  EXPECT_EQ(addEv->dtypes, "[float32, Scalar]");
  const std::string grouped = prof.table({.groupByShapes = true});
  EXPECT_NE(grouped.find("Input Shapes"), std::string::npos);
  EXPECT_NE(grouped.find("[[2, 3], [3, 4]]"), std::string::npos) << grouped;
}

TEST(Profiler, BackwardLinkedToForward) {
  Profile prof;
  Tensor x = randn({4, 5}, {.requiresGrad = true}), w = randn({5, 3}, {.requiresGrad = true});
  Tensor loss = mul(mm(x, w), 2.0).sum();
  loss.backward();
  const auto& ev = prof.events();
  const Event* fwd = findEvent(ev, "mm");
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(fwd->seq, 0u);
  int linked = 0;
  for (const Event& e : ev)
    if (e.kind == EventKind::Backward && e.seq == fwd->seq) {
      ++linked;
      EXPECT_GT(e.startNs, fwd->endNs);
    }
  EXPECT_EQ(linked, 1);
  // The trace draws the link as a flow from the forward op to its backward.
  nlohmann::json t = nlohmann::json::parse(prof.chromeTrace());
  int fwdbwd = 0;
  for (const auto& e : t["traceEvents"])
    if (e.value("cat", "") == "fwdbwd") ++fwdbwd;
  EXPECT_GE(fwdbwd, 2 * 3);  // mm, mul and sum each have a backward
}

TEST(Profiler, OffRecordsNothingAndOneProfileAtATime) {
  { Tensor a = ones({8}) + 1.0; }
  Profile prof;
  EXPECT_THROW(Profile second, ValueError);
  prof.stop();
  EXPECT_TRUE(prof.events().empty());
  { Tensor a = ones({8}) + 1.0; }  // after stop: not recorded
  EXPECT_TRUE(prof.events().empty());
  Profile again;  // a new one may start once the first stopped
  { Tensor a = ones({8}); }
  EXPECT_NE(findEvent(again.events(), "ones"), nullptr);
  EXPECT_THROW(Profile({.ringSteps = -1}), ValueError);
  EXPECT_THROW(Profile({.stack = true}), ValueError);
  Profile noMemory;
  EXPECT_THROW(noMemory.exportMemoryTimeline(tempPath("x.html")), ValueError);
}

TEST(Profiler, ChromeTraceFollowsTheTraceEventFormat) {
  Profile prof({.memory = true, .shapes = true, .rank = 3});
  Tensor x = randn({8, 8}, {.requiresGrad = true});
  {
    profiler::Range r("with \"quotes\" and \\ backslash");
    gelu(mm(x, x)).sum().backward();
  }
  {
    // Twice through the same graph: two backward spans per forward op, each with its own flow.
    Tensor y = mm(x, x).sum();
    y.backward(Tensor(), /*retainGraph=*/true);
    y.backward();
  }
  std::thread([] {
    profiler::Range r("del \x7f and a byte that is not UTF-8: \xff");
    Tensor a = ones({4}) + 1.0;
  }).join();
  // Collectives in flight together on their group's track, as DDP's buckets are.
  const int64_t t0 = profiler::detail::nowNs();
  for (int64_t seq = 1; seq <= 3; ++seq)
    profiler::detail::recordSpan(EventKind::Collective, "allreduce", "pg test", t0 + seq * 1000, t0 + seq * 1000 + 2500,
                                 {profiler::Arg::str("group", "test"), profiler::Arg::num("seq", seq)});
  profiler::markStep();
  const std::string path = tempPath("trace.json");
  profiler::TraceStats stats = prof.exportChromeTrace(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(ss.str().size()));
  EXPECT_EQ(stats.steps, 1);
  nlohmann::json t = nlohmann::json::parse(ss.str());  // throws on invalid JSON
  ASSERT_TRUE(t["traceEvents"].is_array());
  std::set<std::string> phases;
  std::map<uint64_t, int> flowStarts, flowEnds;
  bool sawMemory = false, sawRange = false, sawProcessName = false, sawBadBytes = false;
  for (const auto& e : t["traceEvents"]) {
    const std::string ph = e.at("ph");
    phases.insert(ph);
    EXPECT_EQ(e.at("pid"), 3);
    if (ph == "X") {
      EXPECT_TRUE(e.at("ts").is_number());
      EXPECT_TRUE(e.at("dur").is_number());
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      EXPECT_TRUE(e.at("tid").is_number_integer());
      EXPECT_TRUE(e.at("name").is_string());
      if (e["name"] == "with \"quotes\" and \\ backslash") sawRange = true;
      if (e["name"] == "del \x7f and a byte that is not UTF-8: \xef\xbf\xbd") sawBadBytes = true;
      if (e["name"] == "mm") {
        EXPECT_EQ(e["args"]["Input Dims"], nlohmann::json::parse("[[8, 8], [8, 8]]"));
        EXPECT_EQ(e["args"]["Input type"], nlohmann::json::parse(R"(["float32", "float32"])"));
      }
    } else if (ph == "s") {
      flowStarts[e.at("id").get<uint64_t>()]++;
    } else if (ph == "f") {
      flowEnds[e.at("id").get<uint64_t>()]++;
      EXPECT_EQ(e.at("bp"), "e");
    } else if (ph == "i") {
      EXPECT_EQ(e.at("name"), "[memory]");
      EXPECT_EQ(e.at("cat"), "cpu_instant_event");
      for (const char* k : {"Device Type", "Device Id", "Addr", "Bytes", "Total Allocated", "Total Reserved"})
        EXPECT_TRUE(e.at("args").contains(k)) << k;
      // The allocator's reserve holds at least what is allocated; an allocation is in both.
      EXPECT_GE(e["args"]["Total Reserved"].get<int64_t>(), e["args"]["Total Allocated"].get<int64_t>());
      if (e["args"]["Bytes"].get<int64_t>() > 0) {
        EXPECT_GE(e["args"]["Total Reserved"].get<int64_t>(), e["args"]["Bytes"].get<int64_t>());
      }
      sawMemory = true;
    } else if (ph == "M") {
      if (e["name"] == "process_name") {
        EXPECT_EQ(e["args"]["name"], "rank 3");
        sawProcessName = true;
      }
    }
  }
  EXPECT_TRUE(sawMemory);
  EXPECT_TRUE(sawRange);
  EXPECT_TRUE(sawProcessName);
  EXPECT_TRUE(sawBadBytes);
  EXPECT_EQ(flowStarts, flowEnds);  // every flow has both ends
  EXPECT_TRUE(phases.count("C"));   // memory by category counter
  std::set<std::string> tracks;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"]);
  EXPECT_TRUE(tracks.count("pg test") && tracks.count("pg test #2")) << "overlapping collectives get a second lane";
  expectPerfettoReadsIt(ss.str());
  std::remove(path.c_str());
}

TEST(Profiler, MergedTraceFlowsLeaveTheRankThatArrivedFirst) {
  // Rank 1 issues the collective 2 us before ranks 0 and 2: the flows must leave its event.
  const int64_t t0 = profiler::detail::nowNs();
  std::vector<std::string> traces;
  for (int rank = 0; rank < 3; ++rank) {
    Profile prof({.rank = rank});
    const int64_t start = t0 + (rank == 1 ? 0 : 2000);
    profiler::detail::recordSpan(EventKind::Collective, "allreduce", "pg world", start, t0 + 5000,
                                 {profiler::Arg::str("group", "world"), profiler::Arg::num("seq", 1)});
    traces.push_back(prof.chromeTrace());
  }
  const std::string merged = profiler::mergeTraces(traces);
  expectPerfettoReadsIt(merged);
  const nlohmann::json t = nlohmann::json::parse(merged);
  int starts = 0, ends = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "s" && e["cat"] == "collective") {
      ++starts;
      EXPECT_EQ(e["pid"], 1);
    }
    if (e["ph"] == "f" && e["cat"] == "collective") ++ends;
  }
  EXPECT_EQ(starts, 2);
  EXPECT_EQ(ends, 2);
}

TEST(Profiler, RingKeepsTheLastSteps) {
  Profile prof({.ringSteps = 2});
  for (int step = 0; step < 6; ++step) {
    profiler::Range r(fmt::format("step body {}", step));
    Tensor a = ones({4}) * static_cast<double>(step);
    profiler::markStep();
  }
  EXPECT_EQ(prof.steps(), 2);
  std::set<std::string> names;
  for (const Event& e : prof.events()) names.insert(e.name);
  EXPECT_FALSE(names.count("step body 0"));
  EXPECT_FALSE(names.count("step body 2"));
  EXPECT_TRUE(names.count("step body 4"));
  EXPECT_TRUE(names.count("step body 5"));
}

TEST(Profiler, MemoryCategoriesPeakAndTimeline) {
  auto model = std::make_shared<nn::Linear>(64, 32);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  Tensor x = randn({16, 64});
  // A first step makes the optimizer's state; the profile sees the second.
  nn::functional::mseLoss(model->forward(x), zeros({16, 32})).backward();
  opt.step();
  const CategoryBytes before = memoryByCategory();
  EXPECT_GE(before.bytes[static_cast<int>(MemoryCategory::Parameters)], (64 * 32 + 32) * 4);
  EXPECT_GE(before.bytes[static_cast<int>(MemoryCategory::Gradients)], (64 * 32 + 32) * 4);
  EXPECT_GE(before.bytes[static_cast<int>(MemoryCategory::OptimizerState)], 2 * (64 * 32 + 32) * 4);

  Profile prof({.memory = true, .stack = true});
  opt.zeroGrad();
  Tensor loss = nn::functional::mseLoss(model->forward(x), zeros({16, 32}));
  loss.backward();
  opt.step();
  prof.stop();
  const profiler::MemoryPeak peak = prof.memoryPeak();
  EXPECT_GE(peak.bytes, before.total());
  EXPECT_EQ(peak.byCategory.total(), peak.bytes);
  ASSERT_FALSE(peak.holders.empty());
  int64_t held = 0;
  for (const auto& h : peak.holders) held += h.bytes;
  EXPECT_EQ(held, peak.bytes);  // the holders account for every byte at the peak
  bool activations = false;
  for (const auto& m : prof.memoryEvents()) {
    if (m.category == MemoryCategory::Activations && m.kind == profiler::MemoryEventKind::Alloc) activations = true;
    if (m.kind == profiler::MemoryEventKind::Alloc) {
      EXPECT_FALSE(m.stack.empty());
      // The allocator's totals just after the allocation: it is among the live bytes, and the
      // reserve (live plus cached for reuse) holds them.
      EXPECT_GE(m.allocatorBytes, m.bytes);
      EXPECT_GE(m.reservedBytes, m.allocatorBytes);
    }
  }
  EXPECT_TRUE(activations);
  const std::string path = tempPath("memory.html");
  prof.exportMemoryTimeline(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string html = ss.str();
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("What held the peak"), std::string::npos);
  EXPECT_NE(html.find("optimizer state"), std::string::npos);
  std::remove(path.c_str());
}

// The same training run with the profiler on (memory, shapes, stacks) and off ends in the same
// bits.
TEST(Profiler, TrainingIsBitIdenticalWithProfilerOnAndOff) {
  auto run = [](bool profile) {
    manualSeed(7);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(12, 16), nn::GELU(), nn::Linear(16, 4));
    optim::AdamW opt(model->parameters(), {.lr = 1e-2});
    std::unique_ptr<Profile> prof;
    if (profile)
      prof = std::make_unique<Profile>(profiler::ProfileOptions{.memory = true, .shapes = true, .stack = true});
    for (int step = 0; step < 5; ++step) {
      Tensor x = randn({8, 12});
      Tensor y = randint(0, 4, {8});
      opt.zeroGrad();
      nn::functional::crossEntropy(model->forward(x), y).backward();
      opt.step();
    }
    if (prof) {
      EXPECT_EQ(prof->steps(), 5);
    }
    std::vector<Tensor> out;
    for (const Tensor& p : model->parameters()) out.push_back(p.clone());
    return out;
  };
  std::vector<Tensor> off = run(false), on = run(true);
  ASSERT_EQ(off.size(), on.size());
  for (size_t i = 0; i < off.size(); ++i) EXPECT_TRUE(testing::sameBits(off[i], on[i])) << "parameter " << i;
}

}  // namespace
}  // namespace cohort
