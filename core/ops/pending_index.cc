// TEMPORARY during development: definitions not yet written. Each helper deletes its part.
#include <cohort/core/ops/ops.h>
#define PENDING(name) throw NotSupportedError(name " is not written yet")
namespace cohort {
Tensor indexSelect(const Tensor&, int64_t, const Tensor&) { PENDING("indexSelect"); }
Tensor gather(const Tensor&, int64_t, const Tensor&) { PENDING("gather"); }
Tensor scatterAdd(const Tensor&, int64_t, const Tensor&, const Tensor&) { PENDING("scatterAdd"); }
Tensor maskedFill(const Tensor&, const Tensor&, Scalar) { PENDING("maskedFill"); }
Tensor tril(const Tensor&, int64_t) { PENDING("tril"); }
Tensor triu(const Tensor&, int64_t) { PENDING("triu"); }
Tensor oneHot(const Tensor&, int64_t) { PENDING("oneHot"); }
}  // namespace cohort
