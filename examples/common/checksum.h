// A checksum of a model's parameters for the example programs: FNV-1a over every parameter's
// bytes, equal on every rank when DDP kept them in step (the example tests compare the ranks').
#pragma once

#include <cstddef>
#include <cstdint>

#include <cohort/core/nn/module.h>

namespace examples {

inline uint64_t parameterChecksum(cohort::nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const cohort::Tensor& p : model.parameters()) {
    cohort::Tensor c = p.to(cohort::Device::cpu()).contiguous();  // a GPU's parameters through the host
    const auto* b = static_cast<const unsigned char*>(c.dataPtr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace examples
