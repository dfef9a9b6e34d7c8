/*
 * Datasets: random access to examples by index. A Dataset owns (or shares) its data and hands
 * out Examples {data, target}; the DataLoader (data_loader.h) calls get() from its worker
 * threads, several at once, so get() must be safe to call concurrently (it is const, and the
 * datasets here only read immutable tensors). Examples may alias the dataset's storage (views):
 * treat them as read-only, the loader's collate step copies them into fresh batch tensors.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cohort/core/tensor/tensor.h>

namespace cohort::data {

struct Example {
  Tensor data;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(); IndexError otherwise. Called from several threads at once.
  virtual Example get(int64_t index) const = 0;
  // Used in error messages ("TensorDataset(1797 examples)").
  virtual std::string name() const { return "Dataset"; }
};

// Examples are the rows (first dim) of `data` and `targets`, which must have the same first
// dim. get(i) returns views data[i], targets[i] (a 0-dim tensor for 1-D targets).
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor data, Tensor targets);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  std::string name() const override;
  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
  int64_t size_ = 0;
};

// Checks 0 <= index < size for `dataset`, throwing IndexError naming the dataset otherwise.
void checkIndex(const Dataset& dataset, int64_t index);

}  // namespace cohort::data
