#include <cohort/core/nn/container.h>

namespace cohort::nn {

void ModuleList::appendPtr(ModulePtr m) { registerModule(std::to_string(size()), std::move(m)); }

const ModulePtr& ModuleList::operator[](int64_t i) const {
  const int64_t n = static_cast<int64_t>(size());
  int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n) throw IndexError(fmt::format("{}: index {} is out of range for {} modules", name(), i, n));
  return namedChildren().item(static_cast<size_t>(j)).second;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [n, m] : namedChildren()) x = (*m)(x);
  return x;
}

TensorList Sequential::forwardMulti(const TensorList& inputs) {
  TensorList x = inputs;
  for (const auto& [n, m] : namedChildren()) x = m->call(x);
  return x;
}

}  // namespace cohort::nn
