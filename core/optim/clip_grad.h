/*
 * Gradient clipping, torch.nn.utils.clip_grad_norm_'s semantics: the norm is taken over all
 * gradients together (the norm of the per-tensor norms); when it exceeds maxNorm every gradient
 * is scaled in place by maxNorm / (total + 1e-6). Parameters without a gradient are skipped.
 * Host gradients' norms accumulate in double; a device's gradients get one norm each from the
 * device's kernel (float32 sums; 16-bit gradients widened to float32 first, float64 ones in
 * double), brought to the host in one copy per device, and are scaled on the device. A list may
 * mix devices. normType may be any p > 0, 0 (count of non-zeros) or infinity.
 */
#pragma once

#include <limits>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::optim {

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// Returns the total norm before clipping. errorIfNonfinite: a NaN or infinite total norm is a
// ValueError (and nothing is scaled) instead of being returned.
double clipGradNorm(const std::vector<Tensor>& params, double maxNorm, double normType = 2.0,
                    bool errorIfNonfinite = false);

// The total gradient norm alone (no clipping).
double gradNorm(const std::vector<Tensor>& params, double normType = 2.0);

}  // namespace cohort::optim
