// Flight recorder: the ring keeps the newest N entries in order, completions find their entry
// (or are dropped once it was overwritten), the JSON has the documented shape, and SIGUSR1 makes
// the background thread write every live recorder to the dump folder.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cohort/core/util/error.h>
#include <cohort/distributed/debug/flight_recorder.h>

#include "distributed/env_guard.h"
#include "distributed/store/store_test_util.h"
#include "harness/ranks.h"

using namespace cohort;
using namespace cohort::dist;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using cohort::dist::testing::TempDir;

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls for `p` (written by another thread) for up to 30 s.
bool waitForFile(const fs::path& p) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

// ProcessGroup reads the clock once per op and passes it in; the recorder keeps steady-clock
// times and gives wall-clock ones.
TEST(FlightRecorder, EntriesKeepTheStartTheCallerRead) {
  FlightRecorder fr("world", 4, 0);
  const auto fiveSecondsAgo = std::chrono::steady_clock::now() - std::chrono::seconds(5);
  uint64_t id = fr.recordInPlace(
      7, OpType::Allreduce,
      [](std::string& shapes, std::string& detail) {
        shapes = "[2] float32";
        detail = "op=sum";
      },
      fiveSecondsAgo);
  fr.complete(id, FlightRecorder::State::Completed);
  auto es = fr.entries();
  ASSERT_EQ(es.size(), 1u);
  const auto age = std::chrono::system_clock::now() - es[0].start;
  EXPECT_GE(age, std::chrono::milliseconds(4900));
  EXPECT_LT(age, std::chrono::seconds(60));
  EXPECT_GE(es[0].end - es[0].start, std::chrono::milliseconds(4900));
  EXPECT_LE(es[0].end, std::chrono::system_clock::now());
  EXPECT_EQ(es[0].op, "allreduce");
  EXPECT_EQ(es[0].shapes, "[2] float32");
  EXPECT_EQ(es[0].detail, "op=sum");
}

TEST(FlightRecorder, RecordsAndCompletesInOrder) {
  FlightRecorder fr("world", 8, 0);
  uint64_t a = fr.recordStart(OpType::Allreduce, 1, "[4, 8]", "float32", "sum");
  uint64_t b = fr.recordStart(OpType::Broadcast, 2, "[3]", "int64", "root=1");
  uint64_t c = fr.record(0, "send", "[2]", "to rank 1 tag 0", "float32");
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(c, 3u);
  fr.complete(a, FlightRecorder::State::Completed);
  fr.complete(b, false, "peer rank 1 disconnected");
  auto es = fr.entries();
  ASSERT_EQ(es.size(), 3u);
  EXPECT_EQ(es[0].op, "allreduce");
  EXPECT_EQ(es[0].seq, 1u);
  EXPECT_EQ(es[0].shapes, "[4, 8]");
  EXPECT_EQ(es[0].dtype, "float32");
  EXPECT_EQ(es[0].detail, "sum");
  EXPECT_EQ(es[0].state, FlightRecorder::State::Completed);
  EXPECT_GE(es[0].end, es[0].start);
  EXPECT_EQ(es[1].op, "broadcast");
  EXPECT_EQ(es[1].state, FlightRecorder::State::Failed);
  EXPECT_EQ(es[1].error, "peer rank 1 disconnected");
  EXPECT_EQ(es[2].op, "send");
  EXPECT_EQ(es[2].seq, 0u);
  EXPECT_EQ(es[2].state, FlightRecorder::State::Scheduled);
  EXPECT_EQ(fr.recorded(), 3u);
}

TEST(FlightRecorder, RingKeepsTheNewestEntries) {
  FlightRecorder fr("g", 4);
  std::vector<uint64_t> ids;
  for (uint64_t s = 1; s <= 10; ++s) ids.push_back(fr.recordStart(OpType::Allreduce, s, "[1]", "float32"));
  // Completing an entry that left the ring is ignored; the newest ones are updated.
  fr.complete(ids[0], FlightRecorder::State::Completed);
  fr.complete(ids[8], FlightRecorder::State::Completed);
  auto es = fr.entries();
  ASSERT_EQ(es.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(es[i].seq, 7 + i);
    EXPECT_EQ(es[i].id, 7 + i);
    EXPECT_EQ(es[i].state, i == 2 ? FlightRecorder::State::Completed : FlightRecorder::State::Scheduled) << i;
  }
  EXPECT_EQ(fr.recorded(), 10u);
}

TEST(FlightRecorder, ZeroCapacityRecordsNothing) {
  FlightRecorder fr("off", 0);
  EXPECT_EQ(fr.recordStart(OpType::Barrier, 1, ""), 0u);
  fr.complete(0, FlightRecorder::State::Completed);
  EXPECT_TRUE(fr.entries().empty());
  EXPECT_EQ(json::parse(fr.dumpJson())["entries"].size(), 0u);
}

TEST(FlightRecorder, ConcurrentRecordAndComplete) {
  FlightRecorder fr("busy", 64);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        uint64_t id = fr.recordStart(OpType::Allreduce, i + 1, "[1]");
        fr.complete(id, FlightRecorder::State::Completed);
      }
    });
  }
  std::thread reader([&] {
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(json::parse(fr.dumpJson()).is_object());
  });
  for (auto& t : ts) t.join();
  reader.join();
  EXPECT_EQ(fr.recorded(), 2000u);
  auto es = fr.entries();
  ASSERT_EQ(es.size(), 64u);
  for (size_t i = 0; i < es.size(); ++i) {
    EXPECT_EQ(es[i].id, 2000 - 63 + i);
    EXPECT_EQ(es[i].state, FlightRecorder::State::Completed);
  }
}

TEST(FlightRecorder, JsonShape) {
  FlightRecorder fr("grp \"quoted\"", 3, 2);
  uint64_t a = fr.recordStart(OpType::Allgather, 5, "[2, 2]", "bfloat16");
  fr.complete(a, FlightRecorder::State::Failed, "line1\nline2\t\"x\"\x01");
  fr.recordStart(OpType::Barrier, 6, "");
  json j = json::parse(fr.dumpJson());
  EXPECT_EQ(j["group"], "grp \"quoted\"");
  EXPECT_EQ(j["rank"], 2);
  EXPECT_EQ(j["capacity"], 3);
  EXPECT_EQ(j["recorded"], 2);
  ASSERT_EQ(j["entries"].size(), 2u);
  const json& e0 = j["entries"][0];
  EXPECT_EQ(e0["id"], 1);
  EXPECT_EQ(e0["seq"], 5);
  EXPECT_EQ(e0["op"], "allgather");
  EXPECT_EQ(e0["shapes"], "[2, 2]");
  EXPECT_EQ(e0["dtype"], "bfloat16");
  EXPECT_EQ(e0["detail"], "");
  EXPECT_EQ(e0["state"], "failed");
  EXPECT_EQ(e0["error"], "line1\nline2\t\"x\"\x01");
  EXPECT_TRUE(e0["start_us"].is_number_integer());
  EXPECT_TRUE(e0["end_us"].is_number_integer());
  EXPECT_GE(e0["duration_us"].get<int64_t>(), 0);
  EXPECT_EQ(e0["end_us"].get<int64_t>() - e0["start_us"].get<int64_t>(), e0["duration_us"].get<int64_t>());
  // Started within the last minute: the stamps are Unix microseconds.
  int64_t now =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  EXPECT_LE(e0["start_us"].get<int64_t>(), now);
  EXPECT_GT(e0["start_us"].get<int64_t>(), now - 60'000'000);
  const json& e1 = j["entries"][1];
  EXPECT_EQ(e1["op"], "barrier");
  EXPECT_EQ(e1["state"], "scheduled");
  EXPECT_TRUE(e1["end_us"].is_null());
  EXPECT_TRUE(e1["duration_us"].is_null());
}

TEST(FlightRecorder, DumpToFile) {
  TempDir dir;
  FlightRecorder fr("world", 2);
  fr.recordStart(OpType::Allreduce, 1, "[1]");
  fs::path p = dir.path() / "one.json";
  fr.dumpToFile(p.string());
  EXPECT_EQ(json::parse(readFile(p))["entries"][0]["op"], "allreduce");
  try {
    fr.dumpToFile((dir.path() / "no/such/dir/x.json").string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.json"), std::string::npos) << e.what();
  }
}

TEST(FlightRecorder, DumpAllWritesEveryLiveGroup) {
  TempDir dir;
  EnvGuard g;
  g.set("COHORT_FLIGHT_RECORDER_DIR", dir.path().string());
  setFlightRecorderProcessRank(7);
  FlightRecorder a("alpha", 4, 7), b("beta", 4, 1);
  a.recordStart(OpType::Allreduce, 1, "[8]", "float32", "sum");
  b.recordStart(OpType::Broadcast, 1, "[2]", "int32", "root=0");
  {
    FlightRecorder gone("gone", 4);  // destroyed before the dump: not in it
  }
  std::string path = dumpFlightRecorders("timeout in allreduce #1");
  EXPECT_EQ(path, (dir.path() / fmt::format("cohort_flight_recorder_rank7_pid{}.json", ::getpid())).string());
  EXPECT_EQ(path, flightRecorderDumpPath());
  json j = json::parse(readFile(path));
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["rank"], 7);
  EXPECT_EQ(j["pid"], ::getpid());
  EXPECT_EQ(j["reason"], "timeout in allreduce #1");
  std::set<std::string> groups;
  for (const auto& grp : j["groups"]) groups.insert(grp["group"]);
  EXPECT_EQ(groups, (std::set<std::string>{"alpha", "beta"}));
  // An unwritable folder: logged, "" returned, nothing thrown.
  g.set("COHORT_FLIGHT_RECORDER_DIR", (dir.path() / "missing").string());
  EXPECT_EQ(dumpFlightRecorders("x"), "");
}

// Threads of one process (ranks as threads) dumping at the same moment each write a whole file:
// no dump fails because another renamed a shared temporary file away.
TEST(FlightRecorder, ConcurrentDumpsFromOneProcessAllSucceed) {
  TempDir dir;
  EnvGuard g;
  g.set("COHORT_FLIGHT_RECORDER_DIR", dir.path().string());
  FlightRecorder a("alpha", 4);
  a.recordStart(OpType::Allreduce, 1, "[8]", "float32", "sum");
  std::vector<std::string> paths(8);
  std::vector<std::thread> threads;
  for (int round = 0; round < 20; ++round) {
    threads.clear();
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] { paths[t] = dumpFlightRecorders(fmt::format("thread {}", t)); });
    for (auto& t : threads) t.join();
    for (int t = 0; t < 8; ++t) ASSERT_EQ(paths[t], flightRecorderDumpPath()) << "round " << round << " thread " << t;
    json j = json::parse(readFile(paths[0]));
    EXPECT_EQ(j["groups"].size(), 1u);
  }
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(FlightRecorder, Sigusr1DumpsToAFile) {
  TempDir dir;
  EnvGuard g;
  g.set("COHORT_FLIGHT_RECORDER_DIR", dir.path().string());
  setFlightRecorderProcessRank(3);
  FlightRecorder fr("signalled", 16, 3);
  ASSERT_TRUE(installFlightRecorderSignalHandler());
  uint64_t id = fr.recordStart(OpType::Allreduce, 41, "[1024]", "float32", "sum");
  fr.complete(id, FlightRecorder::State::Completed);
  fr.recordStart(OpType::Allreduce, 42, "[1024]", "float32", "sum");  // the "stuck" op
  fs::path expected = dir.path() / fmt::format("cohort_flight_recorder_rank3_pid{}.json", ::getpid());
  uint64_t before = flightRecorderSignalDumps();
  ASSERT_EQ(::raise(SIGUSR1), 0);
  ASSERT_TRUE(waitForFile(expected)) << expected;
  json j = json::parse(readFile(expected));  // written whole (rename), so never half a file
  EXPECT_EQ(j["reason"], "SIGUSR1");
  EXPECT_EQ(j["rank"], 3);
  bool found = false;
  for (const auto& grp : j["groups"]) {
    if (grp["group"] != "signalled") continue;
    found = true;
    ASSERT_EQ(grp["entries"].size(), 2u);
    EXPECT_EQ(grp["entries"][1]["seq"], 42);
    EXPECT_EQ(grp["entries"][1]["state"], "scheduled");
  }
  EXPECT_TRUE(found) << j.dump();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (flightRecorderSignalDumps() == before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(flightRecorderSignalDumps(), before);
}

TEST(FlightRecorder, Sigusr1InAForkedChildDumpsTheChild) {
  TempDir dir;
  EnvGuard g;
  g.set("COHORT_FLIGHT_RECORDER_DIR", dir.path().string());
  FlightRecorder parentRec("parent", 4);
  ASSERT_TRUE(installFlightRecorderSignalHandler());
  // Fork only once the parent's dump thread has started and gone back to waiting: a thread still
  // starting up may hold a lock (under AddressSanitizer, GCC 12's allocator lock) that the child
  // would inherit locked, and its own dump thread would hang on it.
  const auto before = flightRecorderSignalDumps();
  ::raise(SIGUSR1);
  auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (flightRecorderSignalDumps() == before && std::chrono::steady_clock::now() < settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(flightRecorderSignalDumps(), before);
  auto child = cohort::testing::runRanks(1, [&](int, std::ostream&) {
    // The child gets its own dump thread with its first recorder; its dump names its own pid.
    setFlightRecorderProcessRank(1);
    FlightRecorder rec("child", 4, 1);
    rec.recordStart(OpType::Barrier, 1, "");
    ::raise(SIGUSR1);
    fs::path p = dir.path() / fmt::format("cohort_flight_recorder_rank1_pid{}.json", ::getpid());
    return waitForFile(p) ? 0 : 1;
  })[0];
  EXPECT_TRUE(child.ok()) << "the child ended with " << child.describe();
}
