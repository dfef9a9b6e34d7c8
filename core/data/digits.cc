#include <cohort/core/data/digits.h>
#include <cohort/core/data/sampler.h>

#include <charconv>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/data/data_dir.h>
#include <cohort/core/ops/ops.h>

namespace cohort::data {
namespace {

constexpr int kPixels = 64;

struct Parsed {
  std::vector<float> pixels;
  std::vector<int64_t> labels;
};

Parsed parseDigits(const std::string& path, const std::string& text) {
  Parsed out;
  size_t pos = 0;
  int64_t lineNo = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    int field = 0;
    const char* p = line.data();
    const char* e = line.data() + line.size();
    while (true) {
      int v = 0;
      auto [q, ec] = std::from_chars(p, e, v);
      if (ec != std::errc() || q == p)
        throw ValueError(fmt::format("digits: {}:{}: field {} is not an integer", path, lineNo, field + 1));
      if (field < kPixels) {
        if (v < 0 || v > 16)
          throw ValueError(fmt::format("digits: {}:{}: pixel {} = {} is outside 0..16", path, lineNo, field + 1, v));
        out.pixels.push_back(static_cast<float>(v) / 16.0f);
      } else if (field == kPixels) {
        if (v < 0 || v > 9) throw ValueError(fmt::format("digits: {}:{}: label {} is outside 0..9", path, lineNo, v));
        out.labels.push_back(v);
      }
      ++field;
      p = q;
      if (p == e) break;
      if (*p != ',') throw ValueError(fmt::format("digits: {}:{}: expected ',' after field {}", path, lineNo, field));
      ++p;
    }
    if (field != kPixels + 1)
      throw ValueError(fmt::format("digits: {}:{}: expected {} fields (64 pixels and a label), got {}", path, lineNo,
                                   kPixels + 1, field));
  }
  return out;
}

}  // namespace

std::shared_ptr<TensorDataset> digitsFromFile(const std::string& path, const std::string& split) {
  if (split != "train" && split != "test" && split != "all")
    throw ValueError(fmt::format("digits: unknown split '{}' (expected \"train\", \"test\" or \"all\")", split));
  Parsed d = parseDigits(path, readFile(path));
  int64_t n = static_cast<int64_t>(d.labels.size());
  int64_t begin = 0, end = n;
  if (split != "all") {
    if (n != kDigitsCount)
      throw ValueError(fmt::format("digits: {} holds {} images, the \"{}\" split needs the full set of {}", path, n,
                                   split, kDigitsCount));
    if (split == "train") end = kDigitsTrainCount;
    else begin = kDigitsTrainCount;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (split == "all") {
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  } else {
    order = torchRandperm(n, 0);
  }
  std::vector<float> px;
  std::vector<int64_t> lb;
  px.reserve(static_cast<size_t>((end - begin) * kPixels));
  for (int64_t i = begin; i < end; ++i) {
    int64_t row = order[static_cast<size_t>(i)];
    px.insert(px.end(), d.pixels.begin() + row * kPixels, d.pixels.begin() + (row + 1) * kPixels);
    lb.push_back(d.labels[static_cast<size_t>(row)]);
  }
  Tensor x = fromVector(px, {end - begin, kPixels});
  Tensor y = fromVector(lb, {end - begin});
  return std::make_shared<TensorDataset>(std::move(x), std::move(y));
}

std::shared_ptr<TensorDataset> digits(const std::string& split) {
  return digitsFromFile(dataFile("digits.csv"), split);
}

}  // namespace cohort::data
