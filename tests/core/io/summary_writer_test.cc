// io::SummaryWriter (core/io/summary_writer.h) against the real TensorBoard reader: what the writer
// logs (scalars under several tags with steps out of order and non-finite values, histograms of
// tensors and spans with every kind of bins, text), read back by TensorBoard's EventAccumulator in
// tests/core/io/read_events.py, comes back exactly: every step, wall time and value (scalars as
// float32), every bucket. The script runs with the Python of the TensorBoard virtual environment
// that scripts/setup.sh makes (its path is compiled in by tests/CMakeLists.txt; COHORT_PY_VENV
// overrides it); without it those tests skip and say why. Also: the TFRecord framing and its
// CRC32C, the file's name, when the writer flushes, concurrent writers, a truncated last record,
// and the errors for bad input.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cohort/cohort.h>
#include <cohort/core/io/detail/tfrecord.h>
#include <cohort/core/io/summary_writer.h>

#include "core/test_util.h"
#include "temp_dir.h"

using namespace cohort;
using cohort::testing::expectError;
using cohort::testing::runCommand;
using cohort::testing::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string venvDir() {
  if (const char* p = std::getenv("COHORT_PY_VENV"); p && *p) return p;
#ifdef COHORT_PY_VENV_DEFAULT
  return COHORT_PY_VENV_DEFAULT;
#else
  return "";
#endif
}

// The virtual environment's python, or why there is none.
std::string venvPython(std::string* why) {
  const std::string dir = venvDir();
  std::string py = dir + "/bin/python";
  if (dir.empty() || !fs::exists(py)) {
    *why = fmt::format("no TensorBoard virtual environment at '{}' (scripts/setup.sh makes it; COHORT_PY_VENV names "
                       "another)",
                       dir);
    return "";
  }
  return py;
}

fs::path readerScript() { return fs::path(COHORT_SOURCE_DIR) / "tests" / "core" / "io" / "read_events.py"; }

// Runs read_events.py with `args`; its JSON output.
json runReader(const std::string& python, const std::string& args) {
  auto [rc, out] = runCommand(fmt::format("'{}' '{}' {} 2>&1", python, readerScript().string(), args));
  EXPECT_EQ(rc, 0) << out;
  if (rc != 0) return json::object();
  // TensorBoard may print warnings before the JSON: the JSON is the last line.
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  std::string line = out.substr(start == std::string::npos ? 0 : start + 1, end + 1);
  try {
    return json::parse(line);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << e.what() << "\n" << out;
    return json::object();
  }
}
json readEvents(const std::string& python, const fs::path& dir) {
  return runReader(python, fmt::format("'{}'", dir.string()));
}

// A number as read_events.py writes it (non-finite ones as strings).
double number(const json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return kNan;
    if (s == "inf") return kInf;
    if (s == "-inf") return -kInf;
    ADD_FAILURE() << "not a number: " << s;
    return 0;
  }
  return j.get<double>();
}

// Equal bits, or both NaN.
void expectSame(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
  } else {
    EXPECT_EQ(got, want) << what;
  }
}

struct LoggedScalar {
  std::string tag;
  int64_t step;
  double value;
  double wallTime;
};

std::vector<fs::path> eventFiles(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  return out;
}

// The records of a TFRecord file, each checked for its CRCs.
std::vector<std::string> readRecords(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t len;
    uint32_t lenCrc, dataCrc;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&lenCrc, bytes.data() + at + 8, 4);
    EXPECT_EQ(lenCrc, io::detail::maskCrc32c(io::detail::crc32c(bytes.data() + at, 8))) << "record " << out.size();
    if (at + 12 + len + 4 > bytes.size()) break;
    std::memcpy(&dataCrc, bytes.data() + at + 12 + len, 4);
    EXPECT_EQ(dataCrc, io::detail::maskCrc32c(io::detail::crc32c(bytes.data() + at + 12, len)))
        << "record " << out.size();
    out.emplace_back(bytes.data() + at + 12, len);
    at += 12 + len + 4;
  }
  EXPECT_EQ(at, bytes.size()) << file << " ends inside a record";
  return out;
}

}  // namespace

TEST(TfRecord, Crc32cCheckValueAndMask) {
  EXPECT_EQ(io::detail::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(io::detail::crc32c("", 0), 0u);
  // The mask: rotate right by 15, add 0xa282ead8.
  EXPECT_EQ(io::detail::maskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(io::detail::maskCrc32c(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

TEST(TfRecord, FramingIsLengthCrcDataCrc) {
  std::string out = "x";
  io::detail::appendTfRecord(out, "hello");
  ASSERT_EQ(out.size(), 1u + 8 + 4 + 5 + 4);
  uint64_t len;
  std::memcpy(&len, out.data() + 1, 8);
  EXPECT_EQ(len, 5u);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(out.data()) + 1;
  EXPECT_EQ(p[0], 5);  // little endian
  uint32_t lenCrc, dataCrc;
  std::memcpy(&lenCrc, out.data() + 9, 4);
  std::memcpy(&dataCrc, out.data() + 18, 4);
  EXPECT_EQ(lenCrc, io::detail::maskCrc32c(io::detail::crc32c(out.data() + 1, 8)));
  EXPECT_EQ(out.substr(13, 5), "hello");
  EXPECT_EQ(dataCrc, io::detail::maskCrc32c(io::detail::crc32c("hello", 5)));
}

TEST(SummaryWriter, CreatesTheFolderAndAnEventFileNamedLikeTensorFlows) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "runs" / "a" / "b";
  std::string first, second;
  {
    io::SummaryWriter w(dir.string());
    io::SummaryWriter w2(dir.string(), {.filenameSuffix = ".eval"});
    first = w.filePath();
    second = w2.filePath();
    EXPECT_EQ(w.logDir(), dir.string());
  }
  EXPECT_TRUE(fs::is_directory(dir));
  char host[256] = {0};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::regex name(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)(\.eval)?)");
  std::smatch m1, m2;
  const std::string n1 = fs::path(first).filename().string(), n2 = fs::path(second).filename().string();
  ASSERT_TRUE(std::regex_match(n1, m1, name)) << n1;
  ASSERT_TRUE(std::regex_match(n2, m2, name)) << n2;
  EXPECT_EQ(m1[2].str(), host);
  EXPECT_EQ(m1[3].str(), std::to_string(::getpid()));
  EXPECT_EQ(std::stoll(m2[4].str()), std::stoll(m1[4].str()) + 1);  // numbered per process
  EXPECT_EQ(m1[5].str(), "");
  EXPECT_EQ(m2[5].str(), ".eval");
  const auto now = static_cast<long long>(std::time(nullptr));
  EXPECT_LE(std::abs(std::stoll(m1[1].str()) - now), 60);
  EXPECT_EQ(fs::path(first).parent_path(), dir);
  // One record: the file version (field 3 of Event, "brain.Event:2"), with a wall time.
  auto records = readRecords(first);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
}

TEST(SummaryWriter, TensorBoardReadsBackEveryScalarHistogramAndText) {
  std::string why;
  const std::string python = venvPython(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const fs::path dir = tmp.path() / "run";

  // Scalars: several tags, steps out of order and repeated, values float32 cannot hold exactly,
  // beyond its range, denormal, NaN and infinities.
  const double t0 = 1700000000.125;
  std::vector<LoggedScalar> scalars = {{"train/loss", 10, 2.302585092994046, t0 + 0.5},
                                       {"train/loss", 0, 0.1, t0 + 0.25},
                                       {"train/loss", 20, kNan, t0 + 1.0 / 3.0},
                                       {"train/lr", 0, 3e-4, t0},
                                       {"train/lr", 5, 1e-45, t0 + 1e-6},
                                       {"train/loss", 20, kInf, t0 + 2},
                                       {"train/lr", 3, -kInf, 1234.5},
                                       {"eval/accuracy", 100, 0.97, 1.7e9 + 0.001},
                                       {"eval/accuracy", -1, 1e39, t0 + 3},
                                       {"eval/accuracy", 1LL << 40, -0.0, t0 + 4},
                                       {"train/loss", std::numeric_limits<int64_t>::max(), 65504.0,
                                        std::nextafter(t0, 2e9)},
                                       {"üñí/cödé tag", 7, 42.0, t0 + 5}};
  Tensor w = randn({64, 32});
  std::vector<double> spanValues = {-3.5, -1.0, 0.0, 0.0, 0.25, 1.0, 2.0, 2.0, 3.0};
  const std::string markdown = "**lr** 3e-4, batch 32 — ünïcode ✓\n\n| a | b |\n|---|---|\n| 1 | 2 |";
  {
    io::SummaryWriter tb(dir.string());
    for (const auto& s : scalars) tb.addScalar(s.tag, s.value, s.step, s.wallTime);
    tb.addHistogram("weights/fc", w, 1, {}, t0 + 10);
    tb.addHistogram("weights/fc", w * 2.0, 2, {}, t0 + 11);
    tb.addHistogram("weights/half", w.to(DType::BFloat16), 1, {}, t0 + 12);
    tb.addHistogram("edges", std::span<const double>(spanValues), 3, {.edges = {-2.0, 0.0, 1.0, 2.0, 5.0}}, t0 + 13);
    tb.addHistogram("counted", std::span<const double>(spanValues), 4, {.count = 4}, t0 + 14);
    tb.addHistogram("constant", std::vector<double>{5.0, 5.0, 5.0}, 5, {.count = 2}, t0 + 15);
    tb.addText("notes/config", markdown, 0, t0 + 20);
    tb.addText("notes/config", "", 1, t0 + 21);
  }  // the destructor flushes and closes
  ASSERT_EQ(eventFiles(dir).size(), 1u);

  json got = readEvents(python, dir);
  EXPECT_EQ(number(got["file_version"]), 2.0);

  // Scalars: per tag, in the order written; values as float32.
  std::map<std::string, std::vector<LoggedScalar>> byTag;
  for (const auto& s : scalars) byTag[s.tag].push_back(s);
  ASSERT_EQ(got["scalars"].size(), byTag.size()) << got["scalars"].dump();
  for (const auto& [tag, want] : byTag) {
    SCOPED_TRACE(tag);
    ASSERT_TRUE(got["scalars"].contains(tag)) << got["scalars"].dump();
    const json& rows = got["scalars"][tag];
    ASSERT_EQ(rows.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(rows[i]["step"].get<int64_t>(), want[i].step) << i;
      expectSame(number(rows[i]["wall_time"]), want[i].wallTime, fmt::format("wall time {}", i));
      expectSame(number(rows[i]["value"]), static_cast<double>(static_cast<float>(want[i].value)),
                 fmt::format("value {}", i));
    }
  }
  EXPECT_TRUE(std::signbit(number(got["scalars"]["eval/accuracy"][2]["value"])));  // -0.0 stays negative

  // Histograms: what makeHistogram computes, exactly (makeHistogram itself is checked against
  // PyTorch's algorithm below).
  auto expectHistogram = [&](const std::string& tag, size_t index, int64_t step, double wallTime,
                             const io::Histogram& want) {
    SCOPED_TRACE(fmt::format("{} #{}", tag, index));
    ASSERT_TRUE(got["histograms"].contains(tag)) << got["histograms"].dump();
    ASSERT_GT(got["histograms"][tag].size(), index);
    const json& h = got["histograms"][tag][index];
    EXPECT_EQ(h["step"].get<int64_t>(), step);
    EXPECT_EQ(number(h["wall_time"]), wallTime);
    EXPECT_EQ(number(h["min"]), want.min);
    EXPECT_EQ(number(h["max"]), want.max);
    EXPECT_EQ(number(h["num"]), want.num);
    EXPECT_EQ(number(h["sum"]), want.sum);
    EXPECT_EQ(number(h["sum_squares"]), want.sumSquares);
    std::vector<double> limits, counts;
    for (const auto& x : h["bucket_limit"]) limits.push_back(number(x));
    for (const auto& x : h["bucket"]) counts.push_back(number(x));
    EXPECT_EQ(limits, want.bucketLimits);
    EXPECT_EQ(counts, want.bucketCounts);
  };
  const std::vector<double> wv = w.toVector<double>(), w2 = (w * 2.0).toVector<double>(),
                            wh = w.to(DType::BFloat16).toVector<double>();
  ASSERT_EQ(got["histograms"].size(), 5u) << got["histograms"].dump();
  EXPECT_EQ(got["histograms"]["weights/fc"].size(), 2u);
  expectHistogram("weights/fc", 0, 1, t0 + 10, io::makeHistogram(wv));
  expectHistogram("weights/fc", 1, 2, t0 + 11, io::makeHistogram(w2));
  expectHistogram("weights/half", 0, 1, t0 + 12, io::makeHistogram(wh));
  // Bins [-2,0) [0,1) [1,2) [2,5]: -3.5 lies outside; bin 0 holds -1, bin 1 holds 0, 0, 0.25, bin
  // 2 holds 1, bin 3 holds 2, 2, 3 (the last edge is inclusive). An empty bucket ends at -2.
  io::Histogram edges{.min = -3.5, .max = 3.0, .num = 9, .sum = 3.75, .sumSquares = 31.3125};
  edges.bucketLimits = {-2.0, 0.0, 1.0, 2.0, 5.0};
  edges.bucketCounts = {0, 1, 3, 1, 3};
  expectHistogram("edges", 0, 3, t0 + 13, edges);
  // Four equal bins over [-3.5, 3]: edges -3.5, -1.875, -0.25, 1.375, 3.
  io::Histogram counted = edges;
  counted.bucketLimits = {-3.5, -1.875, -0.25, 1.375, 3.0};
  counted.bucketCounts = {0, 1, 1, 4, 3};
  expectHistogram("counted", 0, 4, t0 + 14, counted);
  // All values equal: numpy widens the range by 0.5 each side, to bins [4.5, 5) [5, 5.5]; the
  // empty bucket in front ends where the non-empty one starts.
  io::Histogram constant{.min = 5, .max = 5, .num = 3, .sum = 15, .sumSquares = 75};
  constant.bucketLimits = {5.0, 5.5};
  constant.bucketCounts = {0, 3};
  expectHistogram("constant", 0, 5, t0 + 15, constant);

  // Text: the text plugin's, under the tag as given.
  ASSERT_EQ(got["texts"].size(), 1u) << got["texts"].dump();
  const json& texts = got["texts"]["notes/config"];
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0]["plugin"], "text");
  EXPECT_EQ(texts[0]["text"].get<std::string>(), markdown);
  EXPECT_EQ(texts[0]["step"].get<int64_t>(), 0);
  EXPECT_EQ(number(texts[0]["wall_time"]), t0 + 20);
  EXPECT_EQ(texts[1]["text"].get<std::string>(), "");
  EXPECT_EQ(texts[1]["step"].get<int64_t>(), 1);
}

// makeHistogram's default bins against PyTorch's make_histogram(values, bins="tensorflow") in numpy.
TEST(SummaryWriter, DefaultBinsMatchPyTorch) {
  std::string why;
  const std::string python = venvPython(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  manualSeed(3);
  std::vector<std::vector<double>> cases = {
      (randn({2000}) * 3.0).toVector<double>(),
      rand({500}).toVector<double>(),            // positive only: the first bucket is not at 0
      (rand({300}) * -1e-6).toVector<double>(),  // negative and tiny
      {0.0},                                     // one value at 0
      {0.0, 0.0, 1.0},                           // 0 is the first edge's bucket
      {-1e19, 1e19, 1.0, -1.0},                  // near the last edges
      {1e-13, -1e-13, 1e-12, 123456.789, -0.5},  // inside the gap around 0
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(fmt::format("case {}", c));
    const std::string file = tmp.file(fmt::format("values{}.txt", c));
    {
      std::ofstream out(file);
      for (double v : cases[c]) out << fmt::format("{}\n", v);  // shortest round-trip form
    }
    json ref = runReader(python, fmt::format("--reference-histogram '{}'", file));
    io::Histogram h = io::makeHistogram(cases[c]);
    std::vector<double> limits, counts;
    for (const auto& x : ref["bucket_limit"]) limits.push_back(number(x));
    for (const auto& x : ref["bucket"]) counts.push_back(number(x));
    EXPECT_EQ(h.bucketLimits, limits);
    EXPECT_EQ(h.bucketCounts, counts);
    EXPECT_EQ(h.min, number(ref["min"]));
    EXPECT_EQ(h.max, number(ref["max"]));
    EXPECT_EQ(h.num, number(ref["num"]));
    // numpy sums pairwise and its dot uses BLAS: the last bits may differ.
    double sumAbs = 0;
    for (double v : cases[c]) sumAbs += std::abs(v);
    EXPECT_NEAR(h.sum, number(ref["sum"]), 1e-12 * std::max(1.0, sumAbs));
    EXPECT_NEAR(h.sumSquares, number(ref["sum_squares"]), 1e-12 * std::max(1.0, h.sumSquares));
  }
}

TEST(SummaryWriter, ATruncatedLastRecordIsIgnoredAndTheOthersSurvive) {
  std::string why;
  const std::string python = venvPython(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const fs::path dir = tmp.path() / "run";
  std::string file;
  {
    io::SummaryWriter tb(dir.string());
    for (int i = 0; i < 3; ++i) tb.addScalar("loss", 1.0 / (i + 1), i, 100.0 + i);
    file = tb.filePath();
  }
  ASSERT_EQ(readRecords(file).size(), 4u);
  fs::resize_file(file, fs::file_size(file) - 5);  // into the last record's data
  json got = readEvents(python, dir);
  const json& rows = got["scalars"]["loss"];
  ASSERT_EQ(rows.size(), 2u) << got.dump();
  EXPECT_EQ(rows[1]["step"].get<int64_t>(), 1);
  EXPECT_EQ(number(rows[1]["value"]), 0.5);
  EXPECT_EQ(number(rows[1]["wall_time"]), 101.0);
}

TEST(SummaryWriter, FlushesAfterMaxQueueEventsOrFlushSecsAndOnFlushAndClose) {
  TempDir tmp;
  io::SummaryWriter tb(tmp.file("q"), {.maxQueue = 3, .flushSecs = 3600});
  auto records = [&] { return readRecords(tb.filePath()).size(); };
  EXPECT_EQ(records(), 1u);  // the file version, written at once
  tb.addScalar("a", 1, 0);
  tb.addScalar("a", 2, 1);
  EXPECT_EQ(records(), 1u);
  tb.addScalar("a", 3, 2);  // the third pending event writes all three
  EXPECT_EQ(records(), 4u);
  tb.addScalar("a", 4, 3);
  EXPECT_EQ(records(), 4u);
  tb.flush();
  EXPECT_EQ(records(), 5u);
  tb.addText("t", "x", 0);
  tb.close();
  EXPECT_EQ(records(), 6u);
  tb.close();  // again: nothing
  tb.flush();  // closed: nothing to write

  io::SummaryWriter timed(tmp.file("t"), {.maxQueue = 1000, .flushSecs = 0});
  timed.addScalar("a", 1, 0);  // flushSecs 0: every add writes
  EXPECT_EQ(readRecords(timed.filePath()).size(), 2u);
}

TEST(SummaryWriter, WritersOnManyThreadsLoseNothing) {
  TempDir tmp;
  std::string file;
  constexpr int kThreads = 4, kEach = 250;
  {
    io::SummaryWriter tb(tmp.file("mt"), {.maxQueue = 7});
    file = tb.filePath();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&tb, t] {
        for (int i = 0; i < kEach; ++i) {
          tb.addScalar(fmt::format("thread{}", t), i, i);
          if (i % 50 == 0)
            tb.addHistogram(fmt::format("h{}", t), std::vector<double>{1.0, 2.0, static_cast<double>(i)}, i);
          if (i % 100 == 0) tb.flush();
        }
      });
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(readRecords(file).size(), 1u + kThreads * (kEach + kEach / 50));
}

TEST(SummaryWriter, BadInputIsAValueErrorNamingTheProblem) {
  TempDir tmp;
  io::SummaryWriter tb(tmp.file("bad"));
  expectError<ValueError>([&] { tb.addScalar("", 1.0, 0); }, {"addScalar", "tag is empty"});
  expectError<ValueError>([&] { tb.addScalar("bad\xff", 1.0, 0); }, {"addScalar", "not valid UTF-8"});
  expectError<ValueError>([&] { tb.addText("t", "\xc3(", 0); }, {"addText", "'t'", "not valid UTF-8"});
  expectError<ValueError>([&] { tb.addScalar("loss", 1.0, 0, kNan); }, {"'loss'", "wall time nan is not finite"});
  expectError<ValueError>([&] { tb.addHistogram("h", std::vector<double>{}, 0); }, {"'h'", "no values"});
  expectError<ValueError>([&] { tb.addHistogram("h", empty({0}), 0); }, {"'h'", "no values"});
  expectError<ValueError>([&] { tb.addHistogram("h", Tensor(), 0); }, {"'h'", "undefined"});
  expectError<ValueError>(
      [&] {
        tb.addHistogram("h", std::vector<double>{1.0, kNan, 2.0}, 0);
      },
      {"'h'", "value 1 of 3 is nan", "finite"});
  expectError<ValueError>([&] { tb.addHistogram("h", std::vector<double>{1.0, -kInf}, 0); }, {"value 1 of 2 is -inf"});
  expectError<ValueError>(
      [&] {
        tb.addHistogram("h", std::vector<double>{1.0}, 0, {.edges = {0.0, 2.0, 1.0}});
      },
      {"'h'", "bin edges must increase", "edge 2 is 1 after 2"});
  expectError<ValueError>([&] { tb.addHistogram("h", std::vector<double>{1.0}, 0, {.edges = {0.0}}); },
                          {"at least two"});
  expectError<ValueError>(
      [&] {
        tb.addHistogram("h", std::vector<double>{1.0}, 0, {.edges = {0.0, 1.0}, .count = 3});
      },
      {"not both"});
  expectError<ValueError>([&] { tb.addHistogram("h", std::vector<double>{1.0}, 0, {.count = -1}); },
                          {"bin count -1 is negative"});
  expectError<ValueError>(
      [&] {
        tb.addHistogram("h", std::vector<double>{7.0}, 0, {.edges = {0.0, 1.0}});
      },
      {"'h'", "none of the 1 values", "[0, 1]"});
  expectError<ValueError>([&] { tb.addHistogram("h", std::vector<double>{1e21}, 0); }, {"none of the 1 values"});
  expectError<ValueError>([&] { io::SummaryWriter("", {}); }, {"log directory is empty"});
  expectError<ValueError>([&] { io::SummaryWriter(tmp.file("x"), {.maxQueue = -1}); }, {"maxQueue -1"});
  expectError<ValueError>([&] { io::SummaryWriter(tmp.file("x"), {.flushSecs = kNan}); }, {"flushSecs nan"});
  // Nothing was written by the failed adds: only the file version.
  tb.flush();
  EXPECT_EQ(readRecords(tb.filePath()).size(), 1u);
}

TEST(SummaryWriter, AFolderThatCannotBeMadeOrAClosedWriterIsASummaryWriterError) {
  TempDir tmp;
  { std::ofstream(tmp.file("plain")) << "a file"; }
  // A path through a regular file fails even for root.
  expectError<io::SummaryWriterError>([&] { io::SummaryWriter w(tmp.file("plain") + "/runs"); },
                                      {"cannot create the log directory", "plain/runs"});
  expectError<io::SummaryWriterError>([&] { io::SummaryWriter w(tmp.file("plain")); },
                                      {"cannot create the log directory", "plain'", "Not a directory"});
  io::SummaryWriter tb(tmp.file("run"));
  tb.close();
  expectError<io::SummaryWriterError>([&] { tb.addScalar("loss", 1.0, 0); }, {"addScalar", "closed"});
  expectError<io::SummaryWriterError>([&] { tb.addText("t", "x", 0); }, {"addText", "closed"});
}

// A file that cannot be written (here: the process's file size limit, which fails writes with
// EFBIG once SIGXFSZ is ignored) is a SummaryWriterError naming the file and the reason.
TEST(SummaryWriter, AWriteThatFailsIsASummaryWriterError) {
  TempDir tmp;
  io::SummaryWriter tb(tmp.file("run"), {.maxQueue = 1});
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto oldHandler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    for (int i = 0; i < 10000; ++i) tb.addText("t", std::string(100, 'x'), i);
  } catch (const io::SummaryWriterError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, oldHandler);
  EXPECT_NE(msg.find("writing the event file '" + tb.filePath() + "' failed: File too large"), std::string::npos)
      << msg;
  EXPECT_NO_THROW(tb.close());  // the rest was written now that the limit is gone
}
