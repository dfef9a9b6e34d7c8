// TEMPORARY during development: definitions not yet written. Each helper deletes its part.
#include <cohort/core/ops/ops.h>
#define PENDING(name) throw NotSupportedError(name " is not written yet")
namespace cohort {
Tensor pow(const Tensor&, const Tensor&) { PENDING("pow"); }
Tensor pow(const Tensor&, Scalar) { PENDING("pow"); }
Tensor exp(const Tensor&) { PENDING("exp"); }
Tensor log(const Tensor&) { PENDING("log"); }
Tensor sqrt(const Tensor&) { PENDING("sqrt"); }
Tensor rsqrt(const Tensor&) { PENDING("rsqrt"); }
Tensor abs(const Tensor&) { PENDING("abs"); }
Tensor clamp(const Tensor&, std::optional<Scalar>, std::optional<Scalar>) { PENDING("clamp"); }
Tensor where(const Tensor&, const Tensor&, const Tensor&) { PENDING("where"); }
Tensor maximum(const Tensor&, const Tensor&) { PENDING("maximum"); }
Tensor minimum(const Tensor&, const Tensor&) { PENDING("minimum"); }
Tensor eq(const Tensor&, const Tensor&) { PENDING("eq"); }
Tensor ne(const Tensor&, const Tensor&) { PENDING("ne"); }
Tensor lt(const Tensor&, const Tensor&) { PENDING("lt"); }
Tensor le(const Tensor&, const Tensor&) { PENDING("le"); }
Tensor gt(const Tensor&, const Tensor&) { PENDING("gt"); }
Tensor ge(const Tensor&, const Tensor&) { PENDING("ge"); }
Tensor relu(const Tensor&) { PENDING("relu"); }
Tensor gelu(const Tensor&, bool) { PENDING("gelu"); }
Tensor silu(const Tensor&) { PENDING("silu"); }
Tensor sigmoid(const Tensor&) { PENDING("sigmoid"); }
Tensor tanh(const Tensor&) { PENDING("tanh"); }
Tensor& Tensor::add_(const Tensor&, Scalar) { PENDING("add_"); }
Tensor& Tensor::add_(Scalar) { PENDING("add_"); }
Tensor& Tensor::sub_(const Tensor&, Scalar) { PENDING("sub_"); }
Tensor& Tensor::mul_(const Tensor&) { PENDING("mul_"); }
Tensor& Tensor::mul_(Scalar) { PENDING("mul_"); }
Tensor& Tensor::div_(const Tensor&) { PENDING("div_"); }
Tensor& Tensor::div_(Scalar) { PENDING("div_"); }
Tensor& Tensor::addcmul_(const Tensor&, const Tensor&, Scalar) { PENDING("addcmul_"); }
Tensor& Tensor::addcdiv_(const Tensor&, const Tensor&, Scalar) { PENDING("addcdiv_"); }
Tensor& Tensor::lerp_(const Tensor&, Scalar) { PENDING("lerp_"); }
Tensor& Tensor::clamp_(std::optional<Scalar>, std::optional<Scalar>) { PENDING("clamp_"); }
Tensor& Tensor::sqrt_() { PENDING("sqrt_"); }
Tensor& Tensor::maskedFill_(const Tensor&, Scalar) { PENDING("maskedFill_"); }
}  // namespace cohort
