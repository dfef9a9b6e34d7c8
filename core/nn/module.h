/*
 * nn::Module: the base of every layer and model. A module owns named parameters (leaf tensors
 * that require grad), buffers (state that is not trained, e.g. a causal mask) and child modules,
 * all kept in registration order. Hierarchical names join the path with dots
 * ("transformer.h.3.attn.c_attn.weight"); every traversal (namedParameters, stateDict, the order
 * an optimizer sees parameters in) follows that order, so two processes building the same model
 * agree on names and order without talking. A parameter shared by two modules (weight tying)
 * appears once in namedParameters/parameters (under its first name) and under every name in
 * stateDict, as in PyTorch.
 *
 * Parameter handles stay valid: registerParameter returns the registered Tensor, and a module
 * may keep it and use it in forward. Whatever changes a parameter's storage later (Module::to,
 * loadStateDict, FSDP's flat buffers) changes it inside the parameter's own TensorImpl, so the
 * registry, a member the module kept and an optimizer's list all see the same values. Built-in
 * layers read their weights and children from the registry (parameter("weight"), child("attn")),
 * so replaceParameter and replaceModule (before a wrapper takes the model) are seen too.
 *
 * Calling a module: operator()(x) / call(inputs) run the forward pre-hooks, the virtual forward
 * and the forward hooks. Single-input modules override forward(const Tensor&); modules with
 * several inputs or outputs override forwardMulti(const TensorList&). Hooks see (and may replace)
 * the inputs and outputs as a TensorList; FSDP gathers a unit's parameters in a pre-hook and frees
 * them in a post-hook. Handles remove hooks and stay valid if the module is moved.
 *
 * Ownership: children are held by shared_ptr (a module may be shared); parameters are Tensor
 * handles, so an optimizer holding parameters() sees in-place changes, loadStateDict and to(dtype)
 * included (both keep each parameter's TensorImpl and change what is inside it).
 * Threads: a module is not thread-safe; build and mutate it on one thread. Forward may run on
 * any one thread at a time.
 */
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/nn/ordered_dict.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using TensorList = std::vector<Tensor>;
// name -> tensor in registration order (parameters first, then persistent buffers, per module).
using StateDict = OrderedDict<Tensor>;

// Runs before forward; may change the inputs in place (replace or reorder tensors).
using ForwardPreHook = std::function<void(Module& module, TensorList& inputs)>;
// Runs after forward; may replace the outputs.
using ForwardHook = std::function<void(Module& module, const TensorList& inputs, TensorList& outputs)>;

namespace detail {
struct HookTable {
  std::vector<std::pair<int, ForwardPreHook>> pre;
  std::vector<std::pair<int, ForwardHook>> post;
  int nextId = 1;
};
}  // namespace detail

// Removes a hook it was returned for. Safe to call twice, after the module moved, or after the
// module was destroyed (then it does nothing).
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<detail::HookTable> table, int id) : table_(std::move(table)), id_(id) {}
  void remove();
  bool active() const;

 private:
  std::weak_ptr<detail::HookTable> table_;
  int id_ = 0;
};

// The dict with `prefix` taken off every key that starts with it (other keys are kept as they
// are), in the same order: stripPrefix(ddp.stateDict(), "module.") is the bare model's state
// dict, as torch.nn.modules.utils.consume_prefix_in_state_dict_if_present makes it. Stripping
// two keys to one name is a ValueError naming both.
StateDict stripPrefix(const StateDict& dict, const std::string& prefix = "module.");

// What a non-strict loadStateDict found (a strict load throws instead).
struct LoadStateDictResult {
  std::vector<std::string> missingKeys;     // in the module, not in the dict
  std::vector<std::string> unexpectedKeys;  // in the dict, not in the module
  bool ok() const { return missingKeys.empty() && unexpectedKeys.empty(); }
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // Moving keeps the registered tensors (handles) and children; Sequential's variadic constructor
  // moves layers into shared_ptrs this way.
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  // The type's name ("Linear"), used in messages and toString().
  const std::string& name() const { return name_; }

  // ---- calling ---------------------------------------------------------------------------
  // Runs pre-hooks, forward and hooks. The single-tensor form requires one output.
  Tensor operator()(const Tensor& input);
  TensorList operator()(const TensorList& inputs) { return call(inputs); }
  TensorList call(const TensorList& inputs);
  // Override one of these. The defaults forward to each other (one input <-> one output); a module
  // that overrides neither throws NotSupportedError when called.
  virtual Tensor forward(const Tensor& input);
  virtual TensorList forwardMulti(const TensorList& inputs);

  // ---- hooks -------------------------------------------------------------------------------
  // Hooks run in registration order; `prepend` puts a hook first.
  HookHandle registerForwardPreHook(ForwardPreHook hook, bool prepend = false);
  HookHandle registerForwardHook(ForwardHook hook, bool prepend = false);

  // ---- registration ------------------------------------------------------------------------
  // Names are non-empty, contain no '.', and are unique among this module's parameters, buffers
  // and children (ValueError otherwise). A parameter must be a defined floating-point leaf; it is
  // set to require grad (unless requiresGrad is false). Returns the registered handle.
  Tensor registerParameter(const std::string& name, Tensor tensor, bool requiresGrad = true);
  // Non-persistent buffers are left out of stateDict (derived state such as a causal mask).
  Tensor registerBuffer(const std::string& name, Tensor tensor, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "registerModule needs an nn::Module");
    registerModuleImpl(name, module);
    return module;
  }
  template <typename M>
  requires std::is_base_of_v<Module, std::remove_cvref_t<M>> std::shared_ptr<std::remove_cvref_t<M>> registerModule(
      const std::string& name, M&& module) {
    return registerModule(name, std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module)));
  }
  // Swap an existing entry (wrappers use these). The replacement must have the same shape for
  // parameters; a replaced child may be any module.
  void replaceParameter(const std::string& name, Tensor tensor);
  void replaceModule(const std::string& name, ModulePtr module);
  // Sets a buffer's value (registered or not yet: then it is registered as persistent).
  void setBuffer(const std::string& name, Tensor tensor);

  // This module's own entries by name; ValueError naming the module and what it has otherwise.
  const Tensor& parameter(const std::string& name) const;
  const Tensor& buffer(const std::string& name) const;
  const ModulePtr& child(const std::string& name) const;
  bool hasParameter(const std::string& name) const { return params_.contains(name); }
  bool hasBuffer(const std::string& name) const { return buffers_.contains(name); }
  bool hasChild(const std::string& name) const { return children_.contains(name); }

  // ---- traversal (registration order, pre-order over children) -----------------------------
  OrderedDict<Tensor> namedParameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  OrderedDict<Tensor> namedBuffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const OrderedDict<ModulePtr>& namedChildren() const { return children_; }
  std::vector<ModulePtr> children() const { return children_.values(); }
  // This module first (name ""), then every descendant once.
  std::vector<std::pair<std::string, Module*>> namedModules();
  std::vector<Module*> modules();
  // Calls fn on every descendant (children first, as PyTorch's apply) and then on this module.
  Module& apply(const std::function<void(Module&)>& fn);
  int64_t numParameters() const;  // elements over parameters() (tied weights counted once)

  // ---- modes and conversions ---------------------------------------------------------------
  // Sets training mode here and in every descendant (Dropout reads it).
  virtual Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool isTraining() const { return training_; }
  // Converts every floating-point parameter, gradient and buffer to `dtype` in place: each
  // tensor keeps its TensorImpl (optimizers and other handles stay valid) and gets new, contiguous
  // storage. A parameter that was a view of a larger buffer stops being one. Integer buffers are
  // left alone. Optimizer state is not converted (recreate or reload the optimizer after this).
  Module& to(DType dtype);
  // Moves every parameter, buffer and gradient to `device`, keeping each parameter's TensorImpl
  // (handles held by an optimizer or a user see the moved data). Shared tensors move once.
  Module& to(Device device);
  // Clears (setToNone) or zeroes every parameter's gradient.
  void zeroGrad(bool setToNone = true);

  // ---- state dicts -------------------------------------------------------------------------
  // Parameters then persistent buffers of each module, pre-order. The values are detached
  // handles that share storage with the module's tensors.
  // Wrappers whose registry does not hold the model's values override both (FSDP raises, naming
  // fsdp::fullStateDict and the sharded checkpoints).
  virtual StateDict stateDict() const;
  // Copies values in place into the existing tensors (converting dtype). Every problem is checked
  // before anything is written: strict mode throws one ValueError listing every missing,
  // unexpected and mis-shaped key; non-strict mode still throws for mis-shaped keys (nothing is
  // written then) and reports missing and unexpected keys. When every missing key is in the dict
  // under a "module." prefix (a DistributedDataParallel state dict loaded into the bare model),
  // or the other way round, the error says so and how to strip or add the prefix.
  virtual LoadStateDictResult loadStateDict(const StateDict& dict, bool strict = true);

  // ---- printing ----------------------------------------------------------------------------
  // "Linear(in_features=4, out_features=3, bias=true)" plus children, indented like PyTorch.
  std::string toString() const;
  virtual std::string extraRepr() const { return ""; }

 protected:
  bool training_ = true;

 private:
  void checkNewName(const std::string& name, const char* what) const;
  void registerModuleImpl(const std::string& name, ModulePtr module);
  void collectModules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out,
                      std::vector<const Module*>& seen);
  void collectStateDict(const std::string& prefix, StateDict& out) const;
  void printTo(std::string& out, int indent) const;

  std::string name_;
  OrderedDict<Tensor> params_;
  OrderedDict<Tensor> buffers_;
  std::vector<std::string> nonPersistent_;
  OrderedDict<ModulePtr> children_;
  std::shared_ptr<detail::HookTable> hooks_;
  bool inDefaultForward_ = false;
};

// Points `dst`'s TensorImpl at `src`'s data and dtype: at `src`'s storage when `src` is contiguous
// (the two then alias), else at a contiguous copy. Used by Module::to; FSDP may use it to point a
// parameter at gathered memory. `dst` keeps its identity (handles stay valid) and autograd
// metadata; its version counter is bumped. The shapes must match.
void replaceTensorData(Tensor& dst, const Tensor& src);

}  // namespace cohort::nn
