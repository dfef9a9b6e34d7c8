// Argument checks shared by the nn::functional ops (internal to core/ops).
#pragma once

#include <fmt/format.h>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>

namespace cohort::nn::functional::op_checks {

inline void requireDefined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(fmt::format("{}: {} is undefined", op, what));
}

inline void requireFloat(const Tensor& t, const char* op, const char* what) {
  requireDefined(t, op, what);
  if (!isFloating(t.dtype()))
    throw ValueError(fmt::format("{}: {} must be a floating-point tensor, got {} of shape {}", op, what, t.dtype(),
                                 shapeStr(t.sizes())));
}

}  // namespace cohort::nn::functional::op_checks
