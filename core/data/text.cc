#include <cohort/core/data/text.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include <cohort/core/data/data_dir.h>
#include <cohort/core/ops/ops.h>

namespace cohort::data {
namespace {

std::string printable(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  if (std::isprint(u) && c != '\'') return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

}  // namespace

CharVocab::CharVocab(std::string_view text) {
  ids_.fill(-1);
  if (text.empty()) throw ValueError("CharVocab: the text is empty");
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  for (int b = 0; b < 256; ++b) {
    if (!seen[b]) continue;
    ids_[b] = static_cast<int32_t>(chars_.size());
    chars_.push_back(static_cast<char>(b));
  }
}

CharVocab CharVocab::fromChars(std::string_view chars) {
  CharVocab v;
  if (chars.empty()) throw ValueError("CharVocab::fromChars: the character list is empty");
  for (char c : chars) {
    if (v.contains(c)) throw ValueError(fmt::format("CharVocab::fromChars: {} appears twice", printable(c)));
    v.ids_[static_cast<unsigned char>(c)] = static_cast<int32_t>(v.chars_.size());
    v.chars_.push_back(c);
  }
  return v;
}

int64_t CharVocab::id(char c) const {
  int32_t i = ids_[static_cast<unsigned char>(c)];
  if (i < 0)
    throw ValueError(fmt::format("CharVocab: {} is not in the vocabulary of {} characters", printable(c), size()));
  return i;
}

char CharVocab::charOf(int64_t id) const {
  if (id < 0 || id >= size())
    throw IndexError(fmt::format("CharVocab: id {} is out of range for a vocabulary of {} characters", id, size()));
  return chars_[static_cast<size_t>(id)];
}

std::vector<int64_t> CharVocab::encode(std::string_view text) const {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t v = ids_[static_cast<unsigned char>(text[i])];
    if (v < 0)
      throw ValueError(fmt::format("CharVocab::encode: {} at offset {} is not in the vocabulary of {} characters",
                                   printable(text[i]), i, size()));
    out[i] = v;
  }
  return out;
}

Tensor CharVocab::encodeTensor(std::string_view text) const { return fromVector(encode(text)); }

std::string CharVocab::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t i : ids) out.push_back(charOf(i));
  return out;
}

std::string CharVocab::decode(const Tensor& ids) const {
  COHORT_CHECK_T(ValueError, ids.defined() && isIntegral(ids.dtype()),
                 "CharVocab::decode: expected an integer tensor, got {}",
                 ids.defined() ? dtypeName(ids.dtype()) : "undefined");
  return decode(ids.toVector<int64_t>());
}

CharDataset::CharDataset(std::vector<int64_t> tokens, int64_t blockSize, int64_t stride)
    : tokens_(std::make_shared<const std::vector<int64_t>>(std::move(tokens))), blockSize_(blockSize),
      stride_(stride == 0 ? blockSize : stride) {
  COHORT_CHECK_T(ValueError, blockSize_ >= 1, "CharDataset: blockSize must be >= 1, got {}", blockSize_);
  COHORT_CHECK_T(ValueError, stride_ >= 1, "CharDataset: stride must be >= 1, got {}", stride_);
  int64_t n = static_cast<int64_t>(tokens_->size());
  if (n < blockSize_ + 1)
    throw ValueError(
        fmt::format("CharDataset: {} tokens are fewer than one window of blockSize+1 = {}", n, blockSize_ + 1));
  size_ = (n - blockSize_ - 1) / stride_ + 1;
}

CharDataset::CharDataset(const CharVocab& vocab, std::string_view text, int64_t blockSize, int64_t stride)
    : CharDataset(vocab.encode(text), blockSize, stride) {}

Example CharDataset::get(int64_t index) const {
  checkIndex(*this, index);
  Tensor x = empty({blockSize_}, {.dtype = DType::Int64});
  Tensor y = empty({blockSize_}, {.dtype = DType::Int64});
  const int64_t* src = tokens_->data() + index * stride_;
  std::copy(src, src + blockSize_, x.data<int64_t>());
  std::copy(src + 1, src + blockSize_ + 1, y.data<int64_t>());
  return {x, y};
}

std::string CharDataset::name() const {
  return fmt::format("CharDataset({} tokens, blockSize {}, stride {})", tokens_->size(), blockSize_, stride_);
}

std::string kjvText(const std::string& split) {
  if (split != "all" && split != "train" && split != "val")
    throw ValueError(fmt::format("kjvText: unknown split '{}' (expected \"all\", \"train\" or \"val\")", split));
  std::string text = readFile(dataFile("kjv.txt"));
  if (split == "all") return text;
  size_t cut = text.size() / 10 * 9;
  return split == "train" ? text.substr(0, cut) : text.substr(cut);
}

}  // namespace cohort::data
