/*
 * Character-level text data for language models. CharVocab maps the distinct bytes of a text
 * to ids 0..size-1 in byte order (so the same text always gives the same ids); CharDataset cuts
 * a token sequence into windows of blockSize+1 tokens and returns (x, y) = (window[0:block],
 * window[1:block+1]) as int64 [blockSize] tensors. Both are immutable after construction and
 * safe to read from several threads.
 */
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/core/data/dataset.h>

namespace cohort::data {

class CharVocab {
 public:
  // The vocabulary of every byte that occurs in `text` (ValueError for an empty text).
  explicit CharVocab(std::string_view text);
  // From an explicit list of distinct characters (as saved by chars()).
  static CharVocab fromChars(std::string_view chars);

  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  const std::string& chars() const { return chars_; }  // id -> char, in id order
  bool contains(char c) const { return ids_[static_cast<unsigned char>(c)] >= 0; }
  int64_t id(char c) const;       // ValueError naming the character when it is not in the vocabulary
  char charOf(int64_t id) const;  // IndexError when out of range

  std::vector<int64_t> encode(std::string_view text) const;
  Tensor encodeTensor(std::string_view text) const;  // int64 [len]
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string decode(const Tensor& ids) const;  // any integer tensor, read in row-major order

 private:
  CharVocab() { ids_.fill(-1); }
  std::string chars_;
  std::array<int32_t, 256> ids_;
};

class CharDataset : public Dataset {
 public:
  // Windows start every `stride` tokens (default: blockSize, so windows do not overlap in x;
  // stride 1 gives every position). The sequence must hold at least blockSize+1 tokens.
  CharDataset(std::vector<int64_t> tokens, int64_t blockSize, int64_t stride = 0);
  CharDataset(const CharVocab& vocab, std::string_view text, int64_t blockSize, int64_t stride = 0);

  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;  // x, y: int64 [blockSize]
  std::string name() const override;
  int64_t blockSize() const { return blockSize_; }
  int64_t stride() const { return stride_; }
  int64_t numTokens() const { return static_cast<int64_t>(tokens_->size()); }

 private:
  std::shared_ptr<const std::vector<int64_t>> tokens_;
  int64_t blockSize_;
  int64_t stride_;
  int64_t size_;
};

// The shipped King James Bible slice (data/kjv.txt, see data/README.md). split: "all", "train"
// (the first 90% of the bytes) or "val" (the last 10%). Build the vocabulary from "all" so both
// splits share it.
std::string kjvText(const std::string& split = "all");

}  // namespace cohort::data
