#include <cohort/core/tensor/tensor.h>

#include <sstream>

#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/tensor/iter.h>

namespace cohort {

std::string shapeStr(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

Shape contiguousStrides(const Shape& sizes) {
  Shape st(sizes.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

int64_t shapeNumel(const Shape& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t wrapDim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  if (dim < -n || dim >= n)
    throw IndexError(fmt::format("{}: dim {} is out of range for a tensor of {} dims (expected [{}, {}])", op, dim,
                                 ndim, -n, n - 1));
  return dim < 0 ? dim + n : dim;
}

Shape broadcastShapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ValueError(fmt::format("{}: shapes {} and {} cannot be broadcast together (dim {}: {} vs {})", op,
                                   shapeStr(a), shapeStr(b), i, da, db));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace detail {
Shape broadcastByteStrides(const Tensor& t, const Shape& shape) {
  const Shape& ts = t.sizes();
  const Shape& st = t.strides();
  size_t n = shape.size();
  COHORT_CHECK_LE(ts.size(), n, "broadcastByteStrides: tensor has more dims than the target");
  Shape out(n, 0);
  int64_t es = static_cast<int64_t>(t.elementSize());
  for (size_t i = 0; i < ts.size(); ++i) {
    size_t d = n - ts.size() + i;
    if (ts[i] == shape[d]) {
      out[d] = st[i] * es;
    } else {
      COHORT_CHECK(ts[i] == 1, "broadcastByteStrides: shape {} does not broadcast to {}", shapeStr(ts),
                   shapeStr(shape));
    }
  }
  return out;
}
}  // namespace detail

// ---- TensorImpl --------------------------------------------------------------------------------

TensorImpl::TensorImpl(std::shared_ptr<Storage> s, int64_t off, Shape sz, Shape st, DType dt)
    : storage(std::move(s)), offset(off), sizes(std::move(sz)), strides(std::move(st)), dtype(dt),
      version(std::make_shared<std::atomic<uint32_t>>(0)) {
  refreshMetadata();
}

TensorImpl::~TensorImpl() = default;

void TensorImpl::refreshMetadata() {
  numel = shapeNumel(sizes);
  contiguous = true;
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) {
      contiguous = false;
      break;
    }
    expected *= sizes[d];
  }
}

// ---- Tensor: metadata ----------------------------------------------------------------------------

void Tensor::requireDefined(const char* what) const {
  if (!impl_) throw ValueError(fmt::format("{}: the tensor is undefined", what));
}

int64_t Tensor::dim() const {
  requireDefined("dim");
  return static_cast<int64_t>(impl_->sizes.size());
}
const Shape& Tensor::sizes() const {
  requireDefined("sizes");
  return impl_->sizes;
}
int64_t Tensor::size(int64_t d) const {
  requireDefined("size");
  if (impl_->sizes.empty()) throw IndexError(fmt::format("size({}): the tensor is 0-dimensional", d));
  return impl_->sizes[wrapDim(d, dim(), "size")];
}
const Shape& Tensor::strides() const {
  requireDefined("strides");
  return impl_->strides;
}
int64_t Tensor::stride(int64_t d) const {
  requireDefined("stride");
  if (impl_->sizes.empty()) throw IndexError(fmt::format("stride({}): the tensor is 0-dimensional", d));
  return impl_->strides[wrapDim(d, dim(), "stride")];
}
int64_t Tensor::numel() const {
  requireDefined("numel");
  return impl_->numel;
}
DType Tensor::dtype() const {
  requireDefined("dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  requireDefined("device");
  return impl_->storage->device();
}
bool Tensor::isContiguous() const {
  requireDefined("isContiguous");
  return impl_->contiguous;
}
int64_t Tensor::storageOffset() const {
  requireDefined("storageOffset");
  return impl_->offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  requireDefined("storage");
  return impl_->storage;
}

void* Tensor::dataPtr() const {
  requireDefined("data");
  const Storage& s = *impl_->storage;
  if (!s.device().isCpu())
    throw NotSupportedError(fmt::format("a tensor of shape {} on {} was read as host memory by code that runs on the "
                                        "CPU only; move it with to(Device::cpu())",
                                        shapeStr(impl_->sizes), s.device()));
  if (s.released())
    throw Error(fmt::format("tensor of shape {} ({}) views storage that was freed; its data cannot be used until "
                            "the storage is reallocated{}{}",
                            shapeStr(impl_->sizes), impl_->dtype, s.releasedNote().empty() ? "" : ": ",
                            s.releasedNote()));
  if (impl_->numel == 0) return static_cast<char*>(s.data());
  // The furthest element this view can reach must lie inside the storage.
  int64_t hi = impl_->offset, lo = impl_->offset;
  for (size_t d = 0; d < impl_->sizes.size(); ++d) {
    int64_t ext = (impl_->sizes[d] - 1) * impl_->strides[d];
    if (ext > 0) hi += ext;
    else lo += ext;
  }
  size_t es = cohort::elementSize(impl_->dtype);
  if (lo < 0 || static_cast<size_t>(hi + 1) * es > s.nbytes())
    throw Error(fmt::format("tensor of shape {} with strides {} at offset {} reaches past its storage of {} bytes",
                            shapeStr(impl_->sizes), shapeStr(impl_->strides), impl_->offset, s.nbytes()));
  return static_cast<char*>(s.data()) + impl_->offset * es;
}

void Tensor::requireScalar() const {
  requireDefined("item");
  if (numel() != 1)
    throw ValueError(fmt::format("item: a tensor with {} elements (shape {}) cannot be converted to a scalar", numel(),
                                 shapeStr(sizes())));
}

// On a device the element is copied to the host first (the copy waits for the work queued on the
// tensor's stream, so the value is the one computed).
double Tensor::itemDouble() const {
  requireScalar();
  if (!device().isCpu()) return detach().to(Device::cpu()).itemDouble();
  return COHORT_DISPATCH(dtype(), "item", [&]<typename T>() -> double {
    return static_cast<double>(static_cast<Acc<T>>(*static_cast<const T*>(dataPtr())));
  });
}

int64_t Tensor::itemInt64() const {
  requireScalar();
  if (!device().isCpu()) return detach().to(Device::cpu()).itemInt64();
  return COHORT_DISPATCH(dtype(), "item", [&]<typename T>() -> int64_t {
    const auto v = static_cast<Acc<T>>(*static_cast<const T*>(dataPtr()));
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      // +-2^63 are exact doubles: [-2^63, 2^63) converts without overflow; NaN fails both tests.
      if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        throw ValueError(fmt::format("item: {} value {} cannot be converted to an integer", dtype(), v));
    }
    return static_cast<int64_t>(v);
  });
}

template <typename T>
std::vector<T> Tensor::toVector() const {
  requireDefined("toVector");
  Tensor c = device().isCpu() ? contiguous() : detach().to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(c.numel()));
  COHORT_DISPATCH(c.dtype(), "toVector", [&]<typename S>() {
    const S* p = static_cast<const S*>(c.dataPtr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(static_cast<Acc<S>>(p[i]));
  });
  return out;
}
template std::vector<float> Tensor::toVector<float>() const;
template std::vector<double> Tensor::toVector<double>() const;
template std::vector<int64_t> Tensor::toVector<int64_t>() const;
template std::vector<int32_t> Tensor::toVector<int32_t>() const;
template std::vector<uint8_t> Tensor::toVector<uint8_t>() const;
template std::vector<bool> Tensor::toVector<bool>() const;

std::string Tensor::toString() const {
  if (!impl_) return "Tensor(undefined)";
  std::string s = fmt::format("Tensor(shape={}, dtype={}, device={}", shapeStr(sizes()), dtype(), device());
  if (impl_->storage->released()) return s + ", storage released)";
  if (numel() <= 32 && device().isCpu()) {
    auto v = toVector<double>();
    s += fmt::format(", values=[{}]", fmt::join(v, ", "));
  }
  if (requiresGrad()) s += ", requiresGrad";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.toString(); }

// ---- Tensor: autograd ----------------------------------------------------------------------------

bool Tensor::requiresGrad() const {
  requireDefined("requiresGrad");
  return impl_->autograd && (impl_->autograd->requiresGrad || impl_->autograd->gradFn);
}

Tensor& Tensor::setRequiresGrad(bool r) {
  requireDefined("setRequiresGrad");
  if (!isLeaf())
    throw ValueError(fmt::format("setRequiresGrad: only leaf tensors can change requiresGrad (this one is the output "
                                 "of {}); use detach() first",
                                 impl_->autograd->gradFn->name()));
  if (r && !isFloating(dtype()))
    throw ValueError(
        fmt::format("setRequiresGrad: only floating-point tensors can require gradients, got {}", dtype()));
  autograd::autogradMeta(*this).requiresGrad = r;
  return *this;
}

bool Tensor::isLeaf() const {
  requireDefined("isLeaf");
  return !impl_->autograd || !impl_->autograd->gradFn;
}

Tensor Tensor::grad() const {
  requireDefined("grad");
  if (!impl_->autograd) return Tensor();
  return impl_->autograd->grad;
}

void Tensor::setGrad(const Tensor& g) {
  requireDefined("setGrad");
  if (g.defined()) {
    if (g.sizes() != sizes() || g.dtype() != dtype())
      throw ValueError(fmt::format("setGrad: gradient of shape {} ({}) does not match the tensor's shape {} ({})",
                                   shapeStr(g.sizes()), g.dtype(), shapeStr(sizes()), dtype()));
  }
  autograd::autogradMeta(*this).grad = g;
}

std::shared_ptr<autograd::Node> Tensor::gradFn() const {
  requireDefined("gradFn");
  return impl_->autograd ? impl_->autograd->gradFn : nullptr;
}

uint32_t Tensor::outputNr() const { return impl_ && impl_->autograd ? impl_->autograd->outputNr : 0; }

void Tensor::backward(const Tensor& gradient, bool retainGraph) const {
  requireDefined("backward");
  autograd::backward({*this}, {gradient}, retainGraph);
}

Tensor Tensor::detach() const {
  requireDefined("detach");
  auto impl = std::make_shared<TensorImpl>(impl_->storage, impl_->offset, impl_->sizes, impl_->strides, impl_->dtype);
  impl->version = impl_->version;
  impl->isView = impl_->isView;
  return Tensor(std::move(impl));
}

Tensor& Tensor::detach_() {
  requireDefined("detach_");
  if (impl_->autograd) {
    impl_->autograd->gradFn.reset();
    impl_->autograd->requiresGrad = false;
    impl_->autograd->outputNr = 0;
  }
  return *this;
}

int Tensor::registerHook(GradHook hook) {
  requireDefined("registerHook");
  if (!requiresGrad()) throw ValueError("registerHook: cannot register a hook on a tensor that does not require grad");
  auto& meta = autograd::autogradMeta(*this);
  if (meta.gradFn) return meta.gradFn->addPreHook(meta.outputNr, std::move(hook));
  int h = meta.nextHandle++;
  meta.hooks.push_back({h, std::move(hook)});
  return h;
}

void Tensor::removeHook(int handle) {
  requireDefined("removeHook");
  auto& meta = autograd::autogradMeta(*this);
  if (meta.gradFn) {
    meta.gradFn->removePreHook(handle);
    return;
  }
  std::erase_if(meta.hooks, [&](const auto& h) { return h.handle == handle; });
}

int Tensor::registerPostAccumulateGradHook(PostAccumulateGradHook hook) {
  requireDefined("registerPostAccumulateGradHook");
  if (!isLeaf() || !requiresGrad())
    throw ValueError("registerPostAccumulateGradHook: only leaf tensors that require grad accumulate gradients");
  auto& meta = autograd::autogradMeta(*this);
  int h = meta.nextHandle++;
  meta.postAccumulateHooks.push_back({h, std::move(hook)});
  return h;
}

void Tensor::removePostAccumulateGradHook(int handle) {
  requireDefined("removePostAccumulateGradHook");
  std::erase_if(autograd::autogradMeta(*this).postAccumulateHooks, [&](const auto& h) { return h.handle == handle; });
}

void Tensor::retainGrad() {
  requireDefined("retainGrad");
  if (isLeaf()) return;  // leaves keep .grad anyway
  auto& meta = *impl_->autograd;
  meta.gradFn->addRetainGrad(meta.outputNr, impl_);
}

uint32_t Tensor::version() const {
  requireDefined("version");
  return impl_->version->load(std::memory_order_relaxed);
}
void Tensor::bumpVersion() const {
  requireDefined("bumpVersion");
  impl_->version->fetch_add(1, std::memory_order_relaxed);
}

// ---- member conveniences forwarding to ops ----------------------------------------------------

Tensor Tensor::add(const Tensor& o, Scalar alpha) const { return cohort::add(*this, o, alpha); }
Tensor Tensor::sub(const Tensor& o, Scalar alpha) const { return cohort::sub(*this, o, alpha); }
Tensor Tensor::mul(const Tensor& o) const { return cohort::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return cohort::div(*this, o); }
Tensor Tensor::neg() const { return cohort::neg(*this); }
Tensor Tensor::pow(const Tensor& e) const { return cohort::pow(*this, e); }
Tensor Tensor::pow(Scalar e) const { return cohort::pow(*this, e); }
Tensor Tensor::exp() const { return cohort::exp(*this); }
Tensor Tensor::log() const { return cohort::log(*this); }
Tensor Tensor::sqrt() const { return cohort::sqrt(*this); }
Tensor Tensor::rsqrt() const { return cohort::rsqrt(*this); }
Tensor Tensor::abs() const { return cohort::abs(*this); }
Tensor Tensor::clamp(std::optional<Scalar> lo, std::optional<Scalar> hi) const { return cohort::clamp(*this, lo, hi); }
Tensor Tensor::relu() const { return cohort::relu(*this); }
Tensor Tensor::gelu(bool approx) const { return cohort::gelu(*this, approx); }
Tensor Tensor::silu() const { return cohort::silu(*this); }
Tensor Tensor::sigmoid() const { return cohort::sigmoid(*this); }
Tensor Tensor::tanh() const { return cohort::tanh(*this); }
Tensor Tensor::eq(const Tensor& o) const { return cohort::eq(*this, o); }
Tensor Tensor::ne(const Tensor& o) const { return cohort::ne(*this, o); }
Tensor Tensor::lt(const Tensor& o) const { return cohort::lt(*this, o); }
Tensor Tensor::le(const Tensor& o) const { return cohort::le(*this, o); }
Tensor Tensor::gt(const Tensor& o) const { return cohort::gt(*this, o); }
Tensor Tensor::ge(const Tensor& o) const { return cohort::ge(*this, o); }
Tensor Tensor::maskedFill(const Tensor& mask, Scalar v) const { return cohort::maskedFill(*this, mask, v); }

Tensor Tensor::sum() const { return cohort::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return cohort::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return cohort::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return cohort::mean(*this, dims, keepdim); }
Tensor Tensor::max() const { return cohort::amax(*this); }
Tensor Tensor::min() const { return cohort::amin(*this); }
std::pair<Tensor, Tensor> Tensor::max(int64_t d, bool keepdim) const { return cohort::max(*this, d, keepdim); }
std::pair<Tensor, Tensor> Tensor::min(int64_t d, bool keepdim) const { return cohort::min(*this, d, keepdim); }
Tensor Tensor::argmax(int64_t d, bool keepdim) const { return cohort::argmax(*this, d, keepdim); }
Tensor Tensor::argmax() const { return cohort::argmax(*this); }
Tensor Tensor::var(const Shape& dims, int64_t c, bool keepdim) const { return cohort::var(*this, dims, c, keepdim); }
Tensor Tensor::std(const Shape& dims, int64_t c, bool keepdim) const { return cohort::std(*this, dims, c, keepdim); }
Tensor Tensor::norm(double p, const Shape& dims, bool keepdim) const { return cohort::norm(*this, p, dims, keepdim); }

Tensor Tensor::matmul(const Tensor& o) const { return cohort::matmul(*this, o); }
Tensor Tensor::tril(int64_t k) const { return cohort::tril(*this, k); }
Tensor Tensor::triu(int64_t k) const { return cohort::triu(*this, k); }
Tensor Tensor::indexSelect(int64_t d, const Tensor& idx) const { return cohort::indexSelect(*this, d, idx); }
Tensor Tensor::gather(int64_t d, const Tensor& idx) const { return cohort::gather(*this, d, idx); }
Tensor Tensor::scatterAdd(int64_t d, const Tensor& idx, const Tensor& src) const {
  return cohort::scatterAdd(*this, d, idx, src);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) {
  return add(a, b.isIntegral() ? Scalar(-b.toInt()) : Scalar(-b.toDouble()));
}
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return mul(b.pow(-1), a); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace cohort

namespace cohort {
void setMemoryCategory(const Tensor& t, MemoryCategory c) {
  if (t.defined() && t.storage()) t.storage()->setCategory(c);
}
}  // namespace cohort
