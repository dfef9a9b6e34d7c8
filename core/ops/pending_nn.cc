// TEMPORARY during development: definitions not yet written. Each helper deletes its part.
#include <cohort/core/ops/functional.h>
#define PENDING(name) throw NotSupportedError(name " is not written yet")
namespace cohort {
Tensor Tensor::softmax(int64_t d) const { return nn::functional::softmax(*this, d); }
Tensor Tensor::logSoftmax(int64_t d) const { return nn::functional::logSoftmax(*this, d); }
}  // namespace cohort
namespace cohort::nn::functional {
Tensor softmax(const Tensor&, int64_t) { PENDING("softmax"); }
Tensor logSoftmax(const Tensor&, int64_t) { PENDING("logSoftmax"); }
Tensor crossEntropy(const Tensor&, const Tensor&, CrossEntropyOptions) { PENDING("crossEntropy"); }
Tensor nllLoss(const Tensor&, const Tensor&, Reduction, int64_t) { PENDING("nllLoss"); }
Tensor mseLoss(const Tensor&, const Tensor&, Reduction) { PENDING("mseLoss"); }
Tensor layerNorm(const Tensor&, const Shape&, const Tensor&, const Tensor&, double) { PENDING("layerNorm"); }
Tensor embedding(const Tensor&, const Tensor&) { PENDING("embedding"); }
Tensor dropout(const Tensor&, double, bool, Generator*) { PENDING("dropout"); }
Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, Conv2dOptions) { PENDING("conv2d"); }
Tensor maxPool2d(const Tensor&, Pool2dOptions) { PENDING("maxPool2d"); }
Tensor avgPool2d(const Tensor&, Pool2dOptions) { PENDING("avgPool2d"); }
}  // namespace cohort::nn::functional
