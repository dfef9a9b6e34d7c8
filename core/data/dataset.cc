#include <cohort/core/data/dataset.h>

#include <fmt/format.h>

#include <cohort/core/util/check.h>

namespace cohort::data {

void checkIndex(const Dataset& dataset, int64_t index) {
  if (index < 0 || index >= dataset.size())
    throw IndexError(
        fmt::format("{}: index {} is out of range for {} examples", dataset.name(), index, dataset.size()));
}

TensorDataset::TensorDataset(Tensor data, Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
  COHORT_CHECK_T(ValueError, data_.defined() && targets_.defined(), "TensorDataset: data and targets must be defined");
  COHORT_CHECK_T(ValueError, data_.dim() >= 1 && targets_.dim() >= 1,
                 "TensorDataset: data {} and targets {} need a first (example) dim", shapeStr(data_.sizes()),
                 shapeStr(targets_.sizes()));
  COHORT_CHECK_T(ValueError, data_.size(0) == targets_.size(0),
                 "TensorDataset: data {} and targets {} differ in their first (example) dim", shapeStr(data_.sizes()),
                 shapeStr(targets_.sizes()));
  // Examples are read from several loader threads: detach so no autograd history is shared.
  data_ = data_.detach();
  targets_ = targets_.detach();
  size_ = data_.size(0);
}

Example TensorDataset::get(int64_t index) const {
  checkIndex(*this, index);
  return {data_.select(0, index), targets_.select(0, index)};
}

std::string TensorDataset::name() const {
  return fmt::format("TensorDataset(data {} {}, targets {} {})", shapeStr(data_.sizes()), data_.dtype(),
                     shapeStr(targets_.sizes()), targets_.dtype());
}

}  // namespace cohort::data
