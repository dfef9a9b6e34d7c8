// FileStore specifics: cleanup by reference count, foreign and damaged files, the lock deadline,
// and the fork rule. The shared behaviour is in store_test.cc.
#include <fcntl.h>
#include <sys/file.h>

#include <filesystem>
#include <fstream>

#include <cohort/core/util/error.h>

#include "distributed/store/store_test_util.h"

namespace cohort::dist::testing {
namespace {

namespace fs = std::filesystem;

TEST(FileStore, LastCloseRemovesTheFiles) {
  TempDir dir;
  std::string path = dir.file("s");
  auto a = std::make_unique<FileStore>(path, Millis{5000});
  EXPECT_TRUE(fs::exists(path));
  EXPECT_TRUE(fs::exists(path + ".lock"));
  EXPECT_EQ(a->numUsers(), 1);
  {
    FileStore b(path, Millis{5000});
    EXPECT_EQ(b.numUsers(), 2);
    b.set("k", "v");
  }
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(a->numUsers(), 1);
  EXPECT_EQ(a->getString("k"), "v");
  a.reset();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".lock"));
  // A new store at the path starts empty.
  FileStore c(path, Millis{5000});
  EXPECT_EQ(c.numKeys(), 0);
  EXPECT_EQ(c.numUsers(), 1);
}

TEST(FileStore, CountSpansProcesses) {
  TempDir dir;
  std::string path = dir.file("s");
  auto parent = std::make_unique<FileStore>(path, Millis{5000});
  auto codes = runChildren(2, [&](int /*i*/) {
    FileStore s(path, Millis{5000});
    s.add("opened", 1);
    s.wait({"opened"});
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  EXPECT_EQ(parent->getString("opened"), "2");
  EXPECT_EQ(parent->numUsers(), 1);  // the children closed theirs
  parent.reset();
  EXPECT_FALSE(fs::exists(path));
}

TEST(FileStore, AForeignFileIsNotTouched) {
  TempDir dir;
  std::string path = dir.file("notes.txt");
  { std::ofstream(path) << "my precious notes, not a store"; }
  try {
    FileStore s(path, Millis{1000});
    FAIL() << "opened a foreign file";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "my precious notes, not a store");
}

TEST(FileStore, APartialRecordFromACrashedWriterIsDropped) {
  TempDir dir;
  std::string path = dir.file("s");
  FileStore a(path, Millis{2000});
  a.set("before", "1");
  {
    // What a writer killed mid-append leaves: a set record whose key and value never arrived.
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const char partial[] = {'S', 10, 0, 0, 0, 20, 0, 0, 0, 'h', 'a'};
    out.write(partial, sizeof partial);
  }
  FileStore b(path, Millis{2000});  // replays the log, ignoring the tail, and appends after it
  EXPECT_EQ(b.getString("before"), "1");
  b.set("after", "2");
  EXPECT_EQ(a.getString("after"), "2");
  EXPECT_EQ(a.numKeys(), 2);
}

TEST(FileStore, AHeldLockCostsATimeoutNotAHang) {
  TempDir dir;
  std::string path = dir.file("s");
  FileStore s(path, Millis{200});
  // Another open file description holding the lock, as a process stopped mid-operation would.
  int fd = ::open((path + ".lock").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  try {
    s.set("k", "v");
    FAIL() << "set ran while the lock was held";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ".lock"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.wait({"k"}, Millis{100}), TimeoutError);
  flock(fd, LOCK_UN);
  ::close(fd);
  s.set("k", "v");
  EXPECT_EQ(s.getString("k"), "v");
}

TEST(FileStore, TheParentsObjectRefusesUseInAForkedChild) {
  TempDir dir;
  std::string path = dir.file("s");
  FileStore s(path, Millis{1000});
  auto codes = runChildren(1, [&](int) {
    try {
      s.set("k", "v");
    } catch (const StoreError& e) {
      if (std::string(e.what()).find("forked child") != std::string::npos) _exit(42);
    }
  });
  EXPECT_EQ(codes[0], 42);
  EXPECT_FALSE(s.check({"k"}));
  EXPECT_EQ(s.numUsers(), 1);
}

TEST(FileStore, AnUncreatablePathIsAStoreErrorNamingIt) {
  try {
    FileStore s("/nonexistent-dir-for-cohort/store", Millis{200});
    FAIL() << "opened a store in a missing directory";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-for-cohort/store"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::dist::testing
