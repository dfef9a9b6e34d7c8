// Data loading: shipped datasets, text encoding, samplers against PyTorch's index lists, and the
// DataLoader's order, determinism, resumable position, threads and error paths.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <cohort/core/data/data_dir.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/data/digits.h>
#include <cohort/core/data/sampler.h>
#include <cohort/core/data/text.h>
#include <cohort/core/ops/ops.h>

using namespace cohort;
using namespace cohort::data;

namespace {

// Dataset i -> (data [2] = {i, -i} float32, target i int64), so a batch's targets are its indices.
std::shared_ptr<TensorDataset> indexDataset(int64_t n) {
  std::vector<float> d;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) {
    d.push_back(static_cast<float>(i));
    d.push_back(-static_cast<float>(i));
    t.push_back(i);
  }
  return std::make_shared<TensorDataset>(fromVector(d, {n, 2}), fromVector(t, {n}));
}

std::vector<std::vector<int64_t>> collect(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto& [x, y] : loader) {
    EXPECT_EQ(x.dim(), 2);
    EXPECT_EQ(y.dim(), 1);
    EXPECT_EQ(x.size(0), y.size(0));
    auto ids = y.toVector<int64_t>();
    auto xs = x.toVector<float>();
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(xs[2 * i], static_cast<float>(ids[i]));
      EXPECT_EQ(xs[2 * i + 1], -static_cast<float>(ids[i]));
    }
    out.push_back(ids);
  }
  return out;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& b) {
  std::vector<int64_t> out;
  for (auto& v : b) out.insert(out.end(), v.begin(), v.end());
  return out;
}

struct EnvGuard {
  std::string name;
  std::optional<std::string> old;
  // v == nullptr: unset while the guard lives.
  EnvGuard(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (v) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~EnvGuard() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

// ---- shipped datasets ------------------------------------------------------------------------

TEST(Digits, LoadsAllImagesWithLabelCounts) {
  auto all = digits("all");
  ASSERT_EQ(all->size(), 1797);
  EXPECT_EQ(all->data().sizes(), (Shape{1797, 64}));
  EXPECT_EQ(all->data().dtype(), DType::Float32);
  EXPECT_EQ(all->targets().dtype(), DType::Int64);
  // Class counts from data/digits.csv (numpy.bincount of the last column).
  const std::vector<int64_t> expect = {178, 182, 177, 183, 181, 182, 181, 179, 174, 180};
  std::vector<int64_t> counts(10, 0);
  for (int64_t y : all->targets().toVector<int64_t>()) counts[static_cast<size_t>(y)]++;
  EXPECT_EQ(counts, expect);
  // Pixels are 0..16 scaled by 1/16; the raw pixel total of the file is 561718.
  auto px = all->data().toVector<float>();
  double total = 0;
  for (float p : px) {
    ASSERT_GE(p, 0.0f);
    ASSERT_LE(p, 1.0f);
    total += p;
  }
  EXPECT_NEAR(total * 16, 561718.0, 1e-3);
  // The first image, row by row (line 1 of digits.csv).
  const std::vector<int> first = {0, 0,  5, 13, 9,  1, 0,  0, 0,  0,  13, 15, 10, 15, 5, 0,  0,  3, 15, 2, 0,  11,
                                  8, 0,  0, 4,  12, 0, 0,  8, 8,  0,  0,  5,  8,  0,  0, 9,  8,  0, 0,  4, 11, 0,
                                  1, 12, 7, 0,  0,  2, 14, 5, 10, 12, 0,  0,  0,  0,  6, 13, 10, 0, 0,  0};
  Example e = all->get(0);
  auto v = e.data.toVector<float>();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(v[static_cast<size_t>(i)], first[static_cast<size_t>(i)] / 16.0f) << i;
  EXPECT_EQ(e.target.item<int64_t>(), 0);
}

TEST(Digits, TrainTestSplitIsFixed) {
  auto train = digits("train");
  auto test = digits("test");
  EXPECT_EQ(train->size(), 1437);
  EXPECT_EQ(test->size(), 360);
  std::vector<int64_t> tc(10, 0);
  for (int64_t y : test->targets().toVector<int64_t>()) tc[static_cast<size_t>(y)]++;
  // Class counts and first test row from torch.randperm(1797, generator=torch.Generator().manual_seed(0))
  // applied to data/digits.csv with /usr/bin/python3 (torch 1.13): test = perm[1437:], perm[1437] = 1084.
  EXPECT_EQ(tc, (std::vector<int64_t>{28, 37, 30, 36, 39, 38, 34, 42, 38, 38}));
  auto all = digits("all");
  EXPECT_EQ(test->get(0).target.item<int64_t>(), all->get(1084).target.item<int64_t>());
  EXPECT_EQ(test->get(0).data.toVector<float>(), all->get(1084).data.toVector<float>());
  // Together the splits hold every image once: per-class counts add up to the whole file's.
  std::vector<int64_t> trc(10, 0), allc(10, 0);
  for (int64_t y : train->targets().toVector<int64_t>()) trc[static_cast<size_t>(y)]++;
  for (int64_t y : all->targets().toVector<int64_t>()) allc[static_cast<size_t>(y)]++;
  for (size_t c = 0; c < 10; ++c) EXPECT_EQ(trc[c] + tc[c], allc[c]) << "class " << c;
  EXPECT_THROW(digits("validation"), ValueError);
}

TEST(Digits, MissingDataDirNamesPathAndKnob) {
  EnvGuard g("COHORT_DATA_DIR", "/nonexistent/cohort-data");
  try {
    digits("train");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/cohort-data/digits.csv"), std::string::npos) << m;
    EXPECT_NE(m.find("COHORT_DATA_DIR"), std::string::npos) << m;
  }
  EXPECT_THROW(kjvText(), ValueError);
}

TEST(DataDir, DefaultIsTheFolderBesideTheLibrary) {
  EnvGuard g("COHORT_DATA_DIR", nullptr);
  // <libdir>/../share/cohort/data, as installed; in the build tree a link to the source's data/.
  std::string dir = dataDir();
  EXPECT_TRUE(dir.ends_with("/share/cohort/data")) << dir;
  EXPECT_TRUE(std::filesystem::path(dir).is_absolute()) << dir;
  EXPECT_EQ(dataFile("digits.csv"), dir + "/digits.csv");
  EXPECT_TRUE(std::filesystem::is_regular_file(dir + "/kjv.txt")) << dir;
}

TEST(DataDir, MissingFolderNamesWhereItLooked) {
  EnvGuard g("COHORT_DATA_DIR", "/nonexistent/cohort-data/");
  EXPECT_EQ(dataDir(), "/nonexistent/cohort-data");
  try {
    dataFile("digits.csv");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("the data folder '/nonexistent/cohort-data' does not exist"), std::string::npos) << m;
    EXPECT_NE(m.find("COHORT_DATA_DIR='/nonexistent/cohort-data', from the environment"), std::string::npos) << m;
  }
  // A folder that exists but lacks the file names the file.
  EnvGuard here("COHORT_DATA_DIR", ::testing::TempDir().c_str());
  try {
    dataFile("no-such-dataset.csv");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no-such-dataset.csv' does not exist"), std::string::npos) << m;
  }
}

TEST(Digits, MalformedFileNamesLine) {
  std::string path = ::testing::TempDir() + "/bad_digits.csv";
  {
    std::ofstream f(path);
    for (int i = 0; i < 64; ++i) f << "1,";
    f << "3\n";
    for (int i = 0; i < 64; ++i) f << (i == 5 ? "17," : "0,");
    f << "2\n";
  }
  try {
    digitsFromFile(path);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path + ":2"), std::string::npos) << m;
    EXPECT_NE(m.find("17"), std::string::npos) << m;
  }
  {
    std::ofstream f(path);
    f << "1,2,3\n";
  }
  EXPECT_THROW(digitsFromFile(path), ValueError);
}

TEST(TensorDatasetTest, RowsAndErrors) {
  auto ds = indexDataset(5);
  Example e = ds->get(3);
  EXPECT_EQ(e.data.toVector<float>(), (std::vector<float>{3, -3}));
  EXPECT_EQ(e.target.dim(), 0);
  EXPECT_EQ(e.target.item<int64_t>(), 3);
  EXPECT_THROW(ds->get(5), IndexError);
  EXPECT_THROW(ds->get(-1), IndexError);
  EXPECT_THROW(TensorDataset(zeros({4, 2}), zeros({3})), ValueError);
}

// ---- text --------------------------------------------------------------------------------------

TEST(CharText, VocabEncodeDecode) {
  CharVocab v("hello world");
  EXPECT_EQ(v.chars(), " dehlorw");  // distinct bytes in byte order
  EXPECT_EQ(v.size(), 8);
  EXPECT_EQ(v.encode("hello"), (std::vector<int64_t>{3, 2, 4, 4, 5}));
  EXPECT_EQ(v.decode(v.encode("world hello")), "world hello");
  Tensor t = v.encodeTensor("low");
  EXPECT_EQ(t.dtype(), DType::Int64);
  EXPECT_EQ(v.decode(t), "low");
  EXPECT_THROW(v.encode("help"), ValueError);
  EXPECT_THROW(v.charOf(8), IndexError);
  CharVocab w = CharVocab::fromChars(v.chars());
  EXPECT_EQ(w.encode("hello"), v.encode("hello"));
  EXPECT_THROW(CharVocab::fromChars("aa"), ValueError);
}

TEST(CharText, DatasetWindowsShiftByOne) {
  CharVocab v("abcdefghij");
  CharDataset ds(v, "abcdefghij", /*blockSize=*/3);  // stride 3: windows at 0, 3, 6
  ASSERT_EQ(ds.size(), 3);
  Example e = ds.get(1);
  EXPECT_EQ(v.decode(e.data), "def");
  EXPECT_EQ(v.decode(e.target), "efg");
  EXPECT_EQ(v.decode(ds.get(2).target), "hij");
  CharDataset dense(v, "abcdefghij", 3, /*stride=*/1);
  EXPECT_EQ(dense.size(), 7);
  EXPECT_EQ(v.decode(dense.get(6).data), "ghi");
  EXPECT_THROW(dense.get(7), IndexError);
  EXPECT_THROW(CharDataset(v, "abc", 3), ValueError);
}

TEST(CharText, ShippedBibleText) {
  std::string all = kjvText();
  EXPECT_EQ(all.size(), 1049530u);
  EXPECT_EQ(all.substr(0, 10), "Genesis 1\n");
  CharVocab v(all);
  EXPECT_EQ(v.size(), 72);
  std::string train = kjvText("train"), val = kjvText("val");
  EXPECT_EQ(train + val, all);
  EXPECT_EQ(train.size(), all.size() / 10 * 9);
  CharDataset ds(v, val, 64);
  EXPECT_EQ(ds.get(0).data.sizes(), (Shape{64}));
  // Batched through the loader: [B, 64] int64 pairs.
  DataLoader loader(std::make_shared<CharDataset>(v, val, 64), {.batchSize = 4});
  auto it = loader.begin();
  EXPECT_EQ(it->data.sizes(), (Shape{4, 64}));
  EXPECT_EQ(it->target.sizes(), (Shape{4, 64}));
  EXPECT_EQ(v.decode(it->data.select(0, 0).slice(0, 1, 64)), v.decode(it->target.select(0, 0).slice(0, 0, 63)));
}

// ---- samplers against torch ---------------------------------------------------------------------

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist(), torch 1.13.1
// (/usr/bin/python3, Debian python3-torch).
TEST(Samplers, RandpermMatchesTorch) {
  struct Case {
    int64_t n;
    uint64_t seed;
    std::vector<int64_t> expect;
  };
  const std::vector<Case> cases = {
      {10, 0, {4, 1, 7, 5, 3, 9, 0, 8, 6, 2}},
      {10, 1, {5, 6, 1, 2, 0, 8, 9, 3, 7, 4}},
      {23, 5, {3, 11, 18, 8, 22, 21, 6, 16, 1, 13, 7, 17, 15, 12, 14, 9, 20, 0, 10, 2, 19, 4, 5}},
  };
  for (const auto& c : cases) EXPECT_EQ(torchRandperm(c.n, c.seed), c.expect) << c.n << " " << c.seed;
  EXPECT_TRUE(torchRandperm(0, 3).empty());
}

// Each row: n, num_replicas, rank, shuffle, seed, epoch, drop_last, then
// list(torch.utils.data.DistributedSampler(list(range(n)), num_replicas, rank, shuffle, seed,
// drop_last)) after set_epoch(epoch), from torch 1.13.1 (/usr/bin/python3).
TEST(Samplers, DistributedSamplerMatchesTorch) {
  struct Case {
    int64_t n, world, rank;
    bool shuffle;
    uint64_t seed;
    int64_t epoch;
    bool dropLast;
    std::vector<int64_t> expect;
  };
  const std::vector<Case> cases = {
      {10, 3, 0, false, 0, 0, false, {0, 3, 6, 9}},
      {10, 3, 2, false, 0, 0, false, {2, 5, 8, 1}},
      {10, 3, 1, false, 0, 0, true, {1, 4, 7}},
      {10, 3, 1, true, 0, 0, false, {1, 3, 8, 4}},
      {10, 3, 2, true, 0, 1, false, {1, 8, 7, 6}},
      {10, 3, 0, true, 7, 3, true, {7, 1, 9}},
      {17, 4, 3, true, 42, 0, false, {15, 11, 2, 0, 3}},
      {17, 4, 3, true, 42, 5, true, {3, 8, 5, 13}},
      {5, 8, 6, true, 1, 2, false, {0}},
      {5, 8, 6, false, 1, 2, false, {1}},
      {5, 8, 2, true, 1, 2, true, {}},
      {2, 5, 4, false, 0, 0, false, {0}},
      {100, 7, 5, true, 123, 9, false, {17, 94, 86, 20, 60, 82, 41, 38, 4, 33, 65, 40, 78, 67, 66}},
      {1, 1, 0, true, 0, 0, false, {0}},
  };
  for (const auto& c : cases) {
    DistributedSampler s(
        {.rank = c.rank, .worldSize = c.world, .shuffle = c.shuffle, .seed = c.seed, .dropLast = c.dropLast});
    s.setEpoch(c.epoch);
    EXPECT_EQ(s.indices(c.n), c.expect) << s.describe() << " n=" << c.n << " epoch=" << c.epoch;
    EXPECT_EQ(s.indices(c.n, c.epoch), c.expect);
    EXPECT_EQ(s.numSamples(c.n), static_cast<int64_t>(c.expect.size()));
  }
}

TEST(Samplers, DistributedSamplerPartitionsAndValidates) {
  // Without drop_last, the ranks' lists together cover every index, padded by repeats.
  const int64_t n = 23, w = 5;
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < w; ++r) {
    auto idx = DistributedSampler({.rank = r, .worldSize = w, .seed = 3}).indices(n, 4);
    EXPECT_EQ(idx.size(), 5u);
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(seen.size(), 25u);
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
  // Deterministic, and the epoch changes the order.
  DistributedSampler s({.rank = 1, .worldSize = 2, .seed = 9});
  EXPECT_EQ(s.indices(50, 0), s.indices(50, 0));
  EXPECT_NE(s.indices(50, 0), s.indices(50, 1));
  EXPECT_THROW(DistributedSampler({.rank = 2, .worldSize = 2}), ValueError);
  EXPECT_THROW(DistributedSampler({.rank = -1, .worldSize = 2}), ValueError);
  EXPECT_THROW(DistributedSampler({.rank = 0, .worldSize = 0}), ValueError);
}

// ---- DataLoader ----------------------------------------------------------------------------

TEST(DataLoaderTest, SequentialBatchesAndDropLast) {
  DataLoader keep(indexDataset(10), {.batchSize = 4});
  EXPECT_EQ(keep.numBatches(), 3);
  auto b = collect(keep);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(b[2], (std::vector<int64_t>{8, 9}));
  DataLoader drop(indexDataset(10), {.batchSize = 4, .dropLast = true});
  EXPECT_EQ(drop.numBatches(), 2);
  auto d = collect(drop);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1], (std::vector<int64_t>{4, 5, 6, 7}));
  DataLoader tiny(indexDataset(3), {.batchSize = 4, .dropLast = true});
  EXPECT_TRUE(collect(tiny).empty());
}

TEST(DataLoaderTest, ShuffleFollowsSeedAndEpoch) {
  DataLoader a(indexDataset(37), {.batchSize = 5, .shuffle = true, .seed = 11});
  auto e0 = collect(a);  // epoch 0
  auto e1 = collect(a);  // the next loop is epoch 1
  EXPECT_EQ(flatten(e0), torchRandperm(37, 11));
  EXPECT_EQ(flatten(e1), torchRandperm(37, 12));
  EXPECT_EQ(a.position(), (DataPosition{2, 0}));
  DataLoader b(indexDataset(37), {.batchSize = 5, .shuffle = true, .seed = 11});
  EXPECT_EQ(collect(b), e0);
  b.setEpoch(1);
  EXPECT_EQ(collect(b), e1);
  DataLoader c(indexDataset(37), {.batchSize = 5, .shuffle = true, .seed = 12});
  EXPECT_NE(collect(c), e0);
}

TEST(DataLoaderTest, WorkerCountDoesNotChangeBatches) {
  for (int64_t epoch : {0, 3}) {
    DataLoader one(indexDataset(101), {.batchSize = 7, .shuffle = true, .seed = 5, .numWorkers = 1});
    DataLoader three(indexDataset(101),
                     {.batchSize = 7, .shuffle = true, .seed = 5, .numWorkers = 3, .prefetchFactor = 1});
    one.setEpoch(epoch);
    three.setEpoch(epoch);
    auto a = collect(one), b = collect(three);
    EXPECT_EQ(a.size(), 15u);
    EXPECT_EQ(a, b);
  }
}

TEST(DataLoaderTest, DistributedSamplerOption) {
  const int64_t n = 23;
  std::vector<int64_t> everything;
  for (int64_t r = 0; r < 3; ++r) {
    DistributedSampler s({.rank = r, .worldSize = 3, .seed = 4});
    DataLoader loader(indexDataset(n), {.batchSize = 3, .shuffle = true, .sampler = s, .numWorkers = 2});
    EXPECT_EQ(loader.numSamples(), 8);
    EXPECT_EQ(flatten(collect(loader)), s.indices(n, 0));
    EXPECT_EQ(flatten(collect(loader)), s.indices(n, 1));  // the loader's epoch drives the sampler
  }
  EXPECT_THROW(DataLoader(indexDataset(n), {.shuffle = true, .sampler = SequentialSampler()}), ValueError);
  EXPECT_THROW(DataLoader(indexDataset(n), {.batchSize = 0}), ValueError);
  EXPECT_THROW(DataLoader(indexDataset(n), {.numWorkers = 0}), ValueError);
}

TEST(DataLoaderTest, PositionResumesExactly) {
  auto opts = DataLoaderOptions{.batchSize = 4, .shuffle = true, .seed = 2, .numWorkers = 2};
  DataLoader ref(indexDataset(30), opts);
  auto full0 = collect(ref), full1 = collect(ref);

  DataLoader a(indexDataset(30), opts);
  std::vector<std::vector<int64_t>> got;
  for (auto& [x, y] : a) {
    got.push_back(y.toVector<int64_t>());
    if (got.size() == 3) break;  // leave early: the position says what comes next
  }
  DataPosition saved = a.position();
  EXPECT_EQ(saved, (DataPosition{0, 3}));

  DataLoader b(indexDataset(30), opts);  // a "fresh process"
  b.setPosition(saved);
  for (auto& v : collect(b)) got.push_back(v);
  EXPECT_EQ(got, full0);
  EXPECT_EQ(b.position(), (DataPosition{1, 0}));
  EXPECT_EQ(collect(b), full1);

  // The loader that broke off continues where it stopped, too.
  auto rest = collect(a);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(full0.begin() + 3, full0.end()));

  EXPECT_THROW(b.setPosition({0, 9}), ValueError);  // 8 batches per epoch
  b.setPosition({4, 8});
  EXPECT_EQ(b.position(), (DataPosition{5, 0}));
}

namespace {

// Counts get() calls; optionally throws at one index, or blocks at one index until released.
class ProbeDataset : public Dataset {
 public:
  explicit ProbeDataset(int64_t n, int64_t throwAt = -1, int64_t blockAt = -1)
      : inner_(indexDataset(n)), throwAt_(throwAt), blockAt_(blockAt) {}
  int64_t size() const override { return inner_->size(); }
  Example get(int64_t i) const override {
    calls.fetch_add(1);
    if (i == throwAt_) throw ValueError(fmt::format("ProbeDataset: example {} is corrupt", i));
    if (i == blockAt_) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return released; });
    }
    return inner_->get(i);
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
    }
    cv.notify_all();
  }
  mutable std::atomic<int64_t> calls{0};
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool released = false;

 private:
  std::shared_ptr<TensorDataset> inner_;
  int64_t throwAt_, blockAt_;
};

}  // namespace

TEST(DataLoaderTest, EarlyBreakStopsWorkers) {
  auto ds = std::make_shared<ProbeDataset>(1000);
  DataLoader loader(ds, {.batchSize = 2, .numWorkers = 3, .prefetchFactor = 2});
  int seen = 0;
  for (auto& batch : loader) {
    (void)batch;
    if (++seen == 2) break;
  }
  // The iterator is gone, so its workers were joined: no more get() calls can happen, and at most
  // the bounded window (2 consumed + 3 * 2 ahead, 2 examples each) was ever read.
  const int64_t after = ds->calls.load();
  EXPECT_LE(after, (2 + 3 * 2) * 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ds->calls.load(), after);
  // And the loader can be iterated again.
  auto it = loader.begin();
  EXPECT_EQ(it->target.toVector<int64_t>(), (std::vector<int64_t>{4, 5}));
  EXPECT_THROW(loader.begin(), Error);  // one live iteration at a time
}

TEST(DataLoaderTest, WorkerExceptionReachesConsumer) {
  for (int workers : {1, 3}) {
    auto ds = std::make_shared<ProbeDataset>(40, /*throwAt=*/17);
    DataLoader loader(ds, {.batchSize = 4, .numWorkers = workers});
    int batches = 0;
    try {
      for (auto& b : loader) {
        (void)b;
        ++batches;
      }
      FAIL() << "expected ValueError";
    } catch (const ValueError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("example 17 is corrupt"), std::string::npos) << m;
      EXPECT_NE(m.find("batch 4 of epoch 0"), std::string::npos) << m;
    }
    EXPECT_EQ(batches, 4);
    EXPECT_EQ(loader.position(), (DataPosition{0, 4}));  // the failed batch was not consumed
  }
}

TEST(DataLoaderTest, TimeoutWhenABatchNeverArrives) {
  auto ds = std::make_shared<ProbeDataset>(8, -1, /*blockAt=*/5);
  {
    DataLoader loader(ds, {.batchSize = 2, .timeout = std::chrono::milliseconds(50)});
    auto it = loader.begin();          // batch 0
    ++it;                              // batch 1
    EXPECT_THROW(++it, TimeoutError);  // batch 2 holds index 5, which blocks
    ds->release();                     // lets the worker finish so the iterator's shutdown can join it
  }
}
