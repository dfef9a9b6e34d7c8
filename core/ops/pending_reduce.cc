// TEMPORARY during development: definitions not yet written. Each helper deletes its part.
#include <cohort/core/ops/ops.h>
#define PENDING(name) throw NotSupportedError(name " is not written yet")
namespace cohort {
Tensor amax(const Tensor&, const Shape&, bool) { PENDING("amax"); }
Tensor amin(const Tensor&, const Shape&, bool) { PENDING("amin"); }
std::pair<Tensor, Tensor> max(const Tensor&, int64_t, bool) { PENDING("max"); }
std::pair<Tensor, Tensor> min(const Tensor&, int64_t, bool) { PENDING("min"); }
Tensor argmax(const Tensor&, std::optional<int64_t>, bool) { PENDING("argmax"); }
Tensor argmin(const Tensor&, std::optional<int64_t>, bool) { PENDING("argmin"); }
Tensor var(const Tensor&, const Shape&, int64_t, bool) { PENDING("var"); }
Tensor std(const Tensor&, const Shape&, int64_t, bool) { PENDING("std"); }
Tensor norm(const Tensor&, double, const Shape&, bool) { PENDING("norm"); }
}  // namespace cohort
