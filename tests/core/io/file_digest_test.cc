// File digests (core/io/atomic_file.h): XXH64 matches the reference implementation's values (as
// `xxhsum -H64` prints them) for inputs around its 32-byte stripes however they are fed in, and the
// digest a write returns is the one digestFile reads back, for plain files and safetensors files.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <cohort/core/io/atomic_file.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>

#include "temp_dir.h"

using namespace cohort;
using namespace cohort::io;

namespace {

std::vector<unsigned char> pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 7 + 3) & 0xff);
  return v;
}

uint64_t xxh64(const void* data, size_t n, size_t piece) {
  Xxh64 h;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t at = 0; at < n; at += piece) h.update(p + at, std::min(piece, n - at));
  if (n == 0) h.update(p, 0);
  return h.digest();
}

TEST(Xxh64, MatchesTheReferenceValuesWhateverThePieces) {
  // printf '' | xxhsum -H64, printf abc | ..., and the pattern above of each length.
  EXPECT_EQ(xxh64("", 0, 1), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64("abc", 3, 1), 0x44bc2cf5ad770999ull);
  const std::vector<std::pair<size_t, uint64_t>> cases = {{31, 0xa2aa5f33cc4a6119ull},
                                                          {32, 0x23c3c17ef790fd97ull},
                                                          {33, 0x50a7cfc7ba588784ull},
                                                          {100, 0xa61f8d4c170fe531ull},
                                                          {1048581, 0xbb8b8f25663affceull}};
  for (const auto& [n, want] : cases) {
    std::vector<unsigned char> v = pattern(n);
    for (size_t piece : {size_t{1}, size_t{7}, size_t{32}, size_t{33}, n})
      EXPECT_EQ(xxh64(v.data(), n, piece), want) << n << " bytes in pieces of " << piece;
  }
  EXPECT_EQ(checksumHex(0x23c3c17ef790fd97ull), "23c3c17ef790fd97");
  EXPECT_EQ(checksumHex(0x1ull), "0000000000000001");
}

TEST(FileDigest, AWriteReturnsTheDigestOfWhatIsOnDisk) {
  cohort::testing::TempDir dir;
  const std::string path = dir.file("f.bin");
  std::vector<unsigned char> v = pattern(100);
  FileDigest written = writeFileAtomically(path, [&](AtomicWriter& w) {
    w.write(v.data(), 40);
    w.write(v.data() + 40, 60);
  });
  EXPECT_EQ(written, (FileDigest{100, 0xa61f8d4c170fe531ull}));
  EXPECT_EQ(digestFile(path), written);

  FileDigest st = saveSafetensors(dir.file("t.safetensors"), {{"a", arange(10)}, {"b", ones({3, 3})}});
  EXPECT_EQ(digestFile(dir.file("t.safetensors")), st);
  EXPECT_GT(st.size, 8u);

  EXPECT_THROW(digestFile(dir.file("absent")), CheckpointError);
  try {
    digestFile(dir.file("absent"));
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("absent")), std::string::npos) << e.what();
  }
}

}  // namespace
