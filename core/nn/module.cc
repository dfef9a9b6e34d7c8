#include <cohort/core/nn/module.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>

namespace cohort::nn {

// ---- hooks -----------------------------------------------------------------------------------

void HookHandle::remove() {
  auto table = table_.lock();
  if (!table) return;
  std::erase_if(table->pre, [&](const auto& h) { return h.first == id_; });
  std::erase_if(table->post, [&](const auto& h) { return h.first == id_; });
  table_.reset();
}

bool HookHandle::active() const {
  auto table = table_.lock();
  if (!table) return false;
  for (const auto& h : table->pre)
    if (h.first == id_) return true;
  for (const auto& h : table->post)
    if (h.first == id_) return true;
  return false;
}

Module::Module(std::string name) : name_(std::move(name)), hooks_(std::make_shared<detail::HookTable>()) {}

HookHandle Module::registerForwardPreHook(ForwardPreHook hook, bool prepend) {
  if (!hook) throw ValueError(fmt::format("{}.registerForwardPreHook: the hook is empty", name_));
  int id = hooks_->nextId++;
  auto entry = std::make_pair(id, std::move(hook));
  if (prepend) hooks_->pre.insert(hooks_->pre.begin(), std::move(entry));
  else hooks_->pre.push_back(std::move(entry));
  return HookHandle(hooks_, id);
}

HookHandle Module::registerForwardHook(ForwardHook hook, bool prepend) {
  if (!hook) throw ValueError(fmt::format("{}.registerForwardHook: the hook is empty", name_));
  int id = hooks_->nextId++;
  auto entry = std::make_pair(id, std::move(hook));
  if (prepend) hooks_->post.insert(hooks_->post.begin(), std::move(entry));
  else hooks_->post.push_back(std::move(entry));
  return HookHandle(hooks_, id);
}

// ---- calling ---------------------------------------------------------------------------------

Tensor Module::operator()(const Tensor& input) {
  if (hooks_->pre.empty() && hooks_->post.empty()) return forward(input);
  TensorList out = call({input});
  if (out.size() != 1)
    throw ValueError(fmt::format("{}: called with one tensor, but forward (or a hook) produced {} outputs; use call()",
                                 name_, out.size()));
  return out[0];
}

TensorList Module::call(const TensorList& inputs) {
  // Copies of the hook lists: a hook may remove itself (or others) while running.
  TensorList in = inputs;
  if (!hooks_->pre.empty()) {
    auto pre = hooks_->pre;
    for (auto& [id, fn] : pre) fn(*this, in);
  }
  TensorList out = in.size() == 1 ? TensorList{forward(in[0])} : forwardMulti(in);
  if (!hooks_->post.empty()) {
    auto post = hooks_->post;
    for (auto& [id, fn] : post) fn(*this, in, out);
  }
  return out;
}

Tensor Module::forward(const Tensor& input) {
  if (inDefaultForward_)
    throw NotSupportedError(fmt::format("{}: forward is not implemented (override forward or forwardMulti)", name_));
  inDefaultForward_ = true;
  TensorList out;
  try {
    out = forwardMulti({input});
  } catch (...) {
    inDefaultForward_ = false;
    throw;
  }
  inDefaultForward_ = false;
  if (out.size() != 1)
    throw ValueError(
        fmt::format("{}: forward produced {} outputs where one was expected; use call()", name_, out.size()));
  return out[0];
}

TensorList Module::forwardMulti(const TensorList& inputs) {
  if (inDefaultForward_)
    throw NotSupportedError(fmt::format("{}: forward is not implemented (override forward or forwardMulti)", name_));
  if (inputs.size() != 1) throw ValueError(fmt::format("{}: takes one input tensor, got {}", name_, inputs.size()));
  inDefaultForward_ = true;
  Tensor out;
  try {
    out = forward(inputs[0]);
  } catch (...) {
    inDefaultForward_ = false;
    throw;
  }
  inDefaultForward_ = false;
  return {out};
}

// ---- registration ----------------------------------------------------------------------------

void Module::checkNewName(const std::string& name, const char* what) const {
  if (name.empty()) throw ValueError(fmt::format("{}.{}: the name is empty", name_, what));
  if (name.find('.') != std::string::npos)
    throw ValueError(fmt::format("{}.{}: name '{}' contains '.'", name_, what, name));
  if (params_.contains(name) || buffers_.contains(name) || children_.contains(name))
    throw ValueError(fmt::format("{}.{}: '{}' is already registered", name_, what, name));
}

Tensor Module::registerParameter(const std::string& name, Tensor tensor, bool requiresGrad) {
  checkNewName(name, "registerParameter");
  if (!tensor.defined())
    throw ValueError(fmt::format("{}.registerParameter('{}'): the tensor is undefined", name_, name));
  if (!tensor.isFloatingPoint())
    throw ValueError(fmt::format("{}.registerParameter('{}'): parameters must be floating point, got {}", name_, name,
                                 tensor.dtype()));
  if (!tensor.isLeaf())
    throw ValueError(fmt::format("{}.registerParameter('{}'): the tensor has autograd history; register a leaf "
                                 "(detach() it first)",
                                 name_, name));
  tensor.setRequiresGrad(requiresGrad);
  setMemoryCategory(tensor, MemoryCategory::Parameters);
  params_.insert(name, tensor);
  return tensor;
}

Tensor Module::registerBuffer(const std::string& name, Tensor tensor, bool persistent) {
  checkNewName(name, "registerBuffer");
  if (!tensor.defined()) throw ValueError(fmt::format("{}.registerBuffer('{}'): the tensor is undefined", name_, name));
  buffers_.insert(name, tensor);
  if (!persistent) nonPersistent_.push_back(name);
  return tensor;
}

void Module::registerModuleImpl(const std::string& name, ModulePtr module) {
  checkNewName(name, "registerModule");
  if (!module) throw ValueError(fmt::format("{}.registerModule('{}'): the module is null", name_, name));
  if (module.get() == this)
    throw ValueError(fmt::format("{}.registerModule('{}'): a module cannot be its own child", name_, name));
  children_.insert(name, std::move(module));
}

void Module::replaceParameter(const std::string& name, Tensor tensor) {
  Tensor* cur = params_.find(name);
  if (!cur) throw ValueError(fmt::format("{}.replaceParameter: no parameter '{}'", name_, name));
  if (!tensor.defined() || tensor.sizes() != cur->sizes())
    throw ValueError(fmt::format("{}.replaceParameter('{}'): replacement of shape {} for a parameter of shape {}",
                                 name_, name, tensor.defined() ? shapeStr(tensor.sizes()) : "undefined",
                                 shapeStr(cur->sizes())));
  *cur = std::move(tensor);
}

void Module::replaceModule(const std::string& name, ModulePtr module) {
  ModulePtr* cur = children_.find(name);
  if (!cur) throw ValueError(fmt::format("{}.replaceModule: no child '{}'", name_, name));
  if (!module) throw ValueError(fmt::format("{}.replaceModule('{}'): the module is null", name_, name));
  *cur = std::move(module);
}

void Module::setBuffer(const std::string& name, Tensor tensor) {
  if (Tensor* cur = buffers_.find(name)) {
    if (!tensor.defined()) throw ValueError(fmt::format("{}.setBuffer('{}'): the tensor is undefined", name_, name));
    *cur = std::move(tensor);
    return;
  }
  registerBuffer(name, std::move(tensor));
}

namespace {
template <typename V>
std::string keyList(const OrderedDict<V>& d) {
  return fmt::format("[{}]", fmt::join(d.keys(), ", "));
}
}  // namespace

const Tensor& Module::parameter(const std::string& name) const {
  const Tensor* t = params_.find(name);
  if (!t) throw ValueError(fmt::format("{}: no parameter '{}' (has {})", name_, name, keyList(params_)));
  return *t;
}
const Tensor& Module::buffer(const std::string& name) const {
  const Tensor* t = buffers_.find(name);
  if (!t) throw ValueError(fmt::format("{}: no buffer '{}' (has {})", name_, name, keyList(buffers_)));
  return *t;
}
const ModulePtr& Module::child(const std::string& name) const {
  const ModulePtr* m = children_.find(name);
  if (!m) throw ValueError(fmt::format("{}: no child module '{}' (has {})", name_, name, keyList(children_)));
  return *m;
}

// ---- traversal -------------------------------------------------------------------------------

void Module::collectModules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out,
                            std::vector<const Module*>& seen) {
  if (std::find(seen.begin(), seen.end(), this) != seen.end()) return;
  seen.push_back(this);
  out.emplace_back(prefix, this);
  for (auto& [n, m] : children_) m->collectModules(prefix.empty() ? n : prefix + "." + n, out, seen);
}

std::vector<std::pair<std::string, Module*>> Module::namedModules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::vector<const Module*> seen;
  collectModules("", out, seen);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (auto& [n, m] : namedModules()) out.push_back(m);
  return out;
}

OrderedDict<Tensor> Module::namedParameters(bool recurse) const {
  OrderedDict<Tensor> out;
  if (!recurse) {
    for (const auto& [n, t] : params_) out.insert(n, t);
    return out;
  }
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [prefix, m] : const_cast<Module*>(this)->namedModules()) {
    for (const auto& [n, t] : m->params_) {
      if (!seen.insert(t.impl()).second) continue;
      out.insert(prefix.empty() ? n : prefix + "." + n, t);
    }
  }
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const { return namedParameters(recurse).values(); }

OrderedDict<Tensor> Module::namedBuffers(bool recurse) const {
  OrderedDict<Tensor> out;
  if (!recurse) {
    for (const auto& [n, t] : buffers_) out.insert(n, t);
    return out;
  }
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [prefix, m] : const_cast<Module*>(this)->namedModules()) {
    for (const auto& [n, t] : m->buffers_) {
      if (!seen.insert(t.impl()).second) continue;
      out.insert(prefix.empty() ? n : prefix + "." + n, t);
    }
  }
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const { return namedBuffers(recurse).values(); }

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, m] : children_) m->apply(fn);
  fn(*this);
  return *this;
}

int64_t Module::numParameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

// ---- modes and conversions -------------------------------------------------------------------

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
  return *this;
}

void replaceTensorData(Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined()) throw ValueError("replaceTensorData: undefined tensor");
  if (dst.sizes() != src.sizes())
    throw ValueError(fmt::format("replaceTensorData: source shape {} differs from destination shape {}",
                                 shapeStr(src.sizes()), shapeStr(dst.sizes())));
  Tensor c = src.contiguous();
  TensorImpl* impl = dst.impl();
  impl->storage = c.storage();
  impl->offset = c.storageOffset();
  impl->strides = c.strides();
  impl->dtype = c.dtype();
  impl->isView = c.impl()->isView;
  impl->refreshMetadata();
  dst.bumpVersion();
}

Module& Module::to(DType dtype) {
  if (!isFloating(dtype)) throw ValueError(fmt::format("{}.to: expected a floating-point dtype, got {}", name_, dtype));
  autograd::NoGradGuard ng;
  std::unordered_set<const TensorImpl*> done;
  auto convert = [&](Tensor t) {
    if (!t.isFloatingPoint() || !done.insert(t.impl()).second) return;
    if (t.dtype() != dtype) replaceTensorData(t, t.detach().to(dtype));
    Tensor g = t.grad();
    if (g.defined() && g.dtype() != dtype) replaceTensorData(g, g.to(dtype));
  };
  for (auto& [prefix, m] : namedModules()) {
    for (auto& [n, t] : m->params_) convert(t);
    for (auto& [n, t] : m->buffers_) convert(t);
  }
  return *this;
}

Module& Module::to(Device device) {
  autograd::NoGradGuard ng;
  std::unordered_set<const TensorImpl*> done;
  auto move = [&](Tensor t) {
    if (!t.defined() || !done.insert(t.impl()).second) return;
    if (t.device() != device) replaceTensorData(t, t.detach().to(device));
    Tensor g = t.grad();
    if (g.defined() && g.device() != device) replaceTensorData(g, g.to(device));
  };
  for (auto& [prefix, m] : namedModules()) {
    for (auto& [n, t] : m->params_) move(t);
    for (auto& [n, t] : m->buffers_) move(t);
  }
  return *this;
}

void Module::zeroGrad(bool setToNone) {
  autograd::NoGradGuard ng;
  for (Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (setToNone) {
      p.setGrad(Tensor());
    } else {
      if (g.gradFn()) {
        g = g.detach();
        p.setGrad(g);
      }
      g.zero_();
    }
  }
}

// ---- state dicts -----------------------------------------------------------------------------

void Module::collectStateDict(const std::string& prefix, StateDict& out) const {
  for (const auto& [n, t] : params_) out.insert(prefix + n, t.detach());
  for (const auto& [n, t] : buffers_) {
    if (std::find(nonPersistent_.begin(), nonPersistent_.end(), n) != nonPersistent_.end()) continue;
    out.insert(prefix + n, t.detach());
  }
  for (const auto& [n, m] : children_) m->collectStateDict(prefix + n + ".", out);
}

StateDict Module::stateDict() const {
  StateDict out;
  collectStateDict("", out);
  return out;
}

LoadStateDictResult Module::loadStateDict(const StateDict& dict, bool strict) {
  StateDict own = stateDict();
  LoadStateDictResult result;
  std::vector<std::string> mismatched;
  for (const auto& [k, t] : own) {
    const Tensor* src = dict.find(k);
    if (!src) {
      result.missingKeys.push_back(k);
      continue;
    }
    if (!src->defined()) {
      mismatched.push_back(fmt::format("{}: undefined tensor in the dict, {} in the model", k, shapeStr(t.sizes())));
    } else if (src->sizes() != t.sizes()) {
      mismatched.push_back(
          fmt::format("{}: {} in the dict, {} in the model", k, shapeStr(src->sizes()), shapeStr(t.sizes())));
    } else if (src->isFloatingPoint() && !t.isFloatingPoint()) {
      mismatched.push_back(
          fmt::format("{}: dtype {} in the dict cannot be loaded into {}", k, src->dtype(), t.dtype()));
    }
  }
  for (const auto& [k, t] : dict)
    if (!own.contains(k)) result.unexpectedKeys.push_back(k);

  const bool fail = !mismatched.empty() || (strict && !result.ok());
  if (fail && strict && !result.missingKeys.empty()) {
    // A DDP state dict ("module.<name>") loaded into the bare model, or a bare one into DDP: every
    // missing key is an unexpected one with the prefix added or taken off.
    const std::string pre = "module.";
    std::unordered_set<std::string> unexpected(result.unexpectedKeys.begin(), result.unexpectedKeys.end());
    auto all = [&](auto pred) { return std::all_of(result.missingKeys.begin(), result.missingKeys.end(), pred); };
    if (all([&](const std::string& k) { return unexpected.count(pre + k) != 0; }))
      throw ValueError(fmt::format(
          "{}.loadStateDict: every key of the dict carries the prefix \"module.\" (e.g. '{}' for the model's '{}'): "
          "it is the state dict of a DistributedDataParallel (or another wrapper) around this model. Load "
          "nn::stripPrefix(dict, \"module.\") instead, or save ddp.module().stateDict(); nothing was loaded",
          name_, pre + result.missingKeys.front(), result.missingKeys.front()));
    if (all([&](const std::string& k) { return k.starts_with(pre) && unexpected.count(k.substr(pre.size())) != 0; }))
      throw ValueError(fmt::format(
          "{}.loadStateDict: every key of this model carries the prefix \"module.\" (e.g. '{}') and the dict has "
          "them without it ('{}'): this model wraps the one the dict was saved from (DistributedDataParallel); load "
          "the dict into ddp.module() instead; nothing was loaded",
          name_, result.missingKeys.front(), result.missingKeys.front().substr(pre.size())));
  }
  if (fail) {
    std::vector<std::string> parts;
    if (strict && !result.missingKeys.empty())
      parts.push_back(fmt::format("missing keys: [{}]", fmt::join(result.missingKeys, ", ")));
    if (strict && !result.unexpectedKeys.empty())
      parts.push_back(fmt::format("unexpected keys: [{}]", fmt::join(result.unexpectedKeys, ", ")));
    if (!mismatched.empty()) parts.push_back(fmt::format("shape mismatch: [{}]", fmt::join(mismatched, "; ")));
    size_t count = mismatched.size() + (strict ? result.missingKeys.size() + result.unexpectedKeys.size() : 0);
    throw ValueError(fmt::format("{}.loadStateDict: {} problem{} (nothing was loaded): {}", name_, count,
                                 count == 1 ? "" : "s", fmt::join(parts, "; ")));
  }
  autograd::NoGradGuard ng;
  for (auto& [k, t] : own) {
    const Tensor* src = dict.find(k);
    if (!src) continue;
    Tensor dst = t;  // detached handle sharing the module tensor's storage
    if (dst.storage() == src->storage() && dst.storageOffset() == src->storageOffset() &&
        dst.strides() == src->strides())
      continue;  // loading a module's own state dict into itself
    dst.copy_(*src);
  }
  return result;
}

StateDict stripPrefix(const StateDict& dict, const std::string& prefix) {
  StateDict out;
  std::unordered_map<std::string, std::string> from;  // new key -> the key it came from
  for (const auto& [k, t] : dict) {
    std::string key = k.starts_with(prefix) ? k.substr(prefix.size()) : k;
    auto [it, fresh] = from.emplace(key, k);
    if (!fresh)
      throw ValueError(
          fmt::format("stripPrefix(\"{}\"): keys '{}' and '{}' both become '{}'", prefix, it->second, k, key));
    out.insert(key, t);
  }
  return out;
}

// ---- printing --------------------------------------------------------------------------------

void Module::printTo(std::string& out, int indent) const {
  out += name_ + "(";
  std::string extra = extraRepr();
  if (children_.empty()) {
    out += extra + ")";
    return;
  }
  std::string pad(static_cast<size_t>(indent + 2), ' ');
  out += "\n";
  if (!extra.empty()) out += pad + extra + "\n";
  for (const auto& [n, m] : children_) {
    out += pad + "(" + n + "): ";
    m->printTo(out, indent + 2);
    out += "\n";
  }
  out += std::string(static_cast<size_t>(indent), ' ') + ")";
}

std::string Module::toString() const {
  std::string out;
  printTo(out, 0);
  return out;
}

}  // namespace cohort::nn
