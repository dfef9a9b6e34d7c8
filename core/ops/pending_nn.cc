// TEMPORARY during development: definitions not yet written. Each helper deletes its part.
#include <cohort/core/ops/functional.h>
#define PENDING(name) throw NotSupportedError(name " is not written yet")
namespace cohort::nn::functional {
Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, Conv2dOptions) { PENDING("conv2d"); }
Tensor maxPool2d(const Tensor&, Pool2dOptions) { PENDING("maxPool2d"); }
Tensor avgPool2d(const Tensor&, Pool2dOptions) { PENDING("avgPool2d"); }
}  // namespace cohort::nn::functional
