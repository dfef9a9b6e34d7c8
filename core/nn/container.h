/*
 * Containers: Sequential (chains children in order), ModuleList (an indexable list whose owner
 * decides how to call it) and ModuleDict (named children). Children are named "0", "1", ... in
 * Sequential and ModuleList, so a block's parameters are "h.3.attn.c_attn.weight".
 *
 *   auto mlp = std::make_shared<nn::Sequential>(nn::Linear(64, 256), nn::ReLU(), nn::Linear(256, 10));
 *   mlp->push_back(nn::Dropout(0.1));
 *   auto first = mlp->at<nn::Linear>(0);
 *
 * Layers passed by value are moved into shared_ptrs; shared_ptrs are shared as they are.
 * Sequential calls each child through Module::operator(), so the children's hooks run.
 */
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include <cohort/core/nn/module.h>

namespace cohort::nn {

namespace detail {
template <typename M>
ModulePtr toModulePtr(M&& m) {
  using D = std::remove_cvref_t<M>;
  if constexpr (std::is_convertible_v<D, ModulePtr>) {
    ModulePtr p = std::forward<M>(m);
    if (!p) throw ValueError("nn container: a module pointer is null");
    return p;
  } else {
    static_assert(std::is_base_of_v<Module, D>, "nn containers hold nn::Module values or shared_ptrs to them");
    return std::make_shared<D>(std::forward<M>(m));
  }
}
// A module passed by value must be an rvalue (modules cannot be copied); pointers may be either.
template <typename M>
concept ModuleLike = (std::is_base_of_v<Module, std::remove_cvref_t<M>> && !std::is_lvalue_reference_v<M>) ||
                     std::is_convertible_v<std::remove_cvref_t<M>, ModulePtr>;
}  // namespace detail

// A list of modules with index names; the base of Sequential.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <detail::ModuleLike... Ms>
  requires(sizeof...(Ms) > 0) explicit ModuleList(Ms&&... modules) : Module("ModuleList") {
    (push_back(detail::toModulePtr(std::forward<Ms>(modules))), ...);
  }

  template <detail::ModuleLike M>
  ModuleList& push_back(M&& module) {
    appendPtr(detail::toModulePtr(std::forward<M>(module)));
    return *this;
  }
  size_t size() const { return namedChildren().size(); }
  bool empty() const { return size() == 0; }
  // The i-th module (negative counts from the end); IndexError when out of range.
  const ModulePtr& operator[](int64_t i) const;
  // The i-th module as M; ValueError when it is not an M.
  template <typename M>
  std::shared_ptr<M> at(int64_t i) const {
    auto p = std::dynamic_pointer_cast<M>((*this)[i]);
    if (!p)
      throw ValueError(fmt::format("{}: module {} is a {}, not the type asked for", name(), i, (*this)[i]->name()));
    return p;
  }
  auto begin() const { return namedChildren().begin(); }
  auto end() const { return namedChildren().end(); }

 protected:
  explicit ModuleList(std::string name) : Module(std::move(name)) {}
  void appendPtr(ModulePtr m);
};

// Calls its children in order, each on the previous one's output.
class Sequential : public ModuleList {
 public:
  Sequential() : ModuleList("Sequential") {}
  template <detail::ModuleLike... Ms>
  requires(sizeof...(Ms) > 0) explicit Sequential(Ms&&... modules) : ModuleList("Sequential") {
    (push_back(detail::toModulePtr(std::forward<Ms>(modules))), ...);
  }
  Tensor forward(const Tensor& input) override;
  TensorList forwardMulti(const TensorList& inputs) override;
};

// Named children in insertion order; the owner calls them.
class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}
  template <typename M>
  requires(std::is_base_of_v<Module, std::remove_cvref_t<M>> &&
           !std::is_lvalue_reference_v<M>) std::shared_ptr<std::remove_cvref_t<M>> insert(const std::string& key,
                                                                                          M&& module) {
    return registerModule(key, std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module)));
  }
  template <typename M>
  std::shared_ptr<M> insert(const std::string& key, std::shared_ptr<M> module) {
    return registerModule(key, std::move(module));
  }
  const ModulePtr& operator[](const std::string& key) const { return child(key); }
  template <typename M>
  std::shared_ptr<M> at(const std::string& key) const {
    auto p = std::dynamic_pointer_cast<M>(child(key));
    if (!p) throw ValueError(fmt::format("ModuleDict: '{}' is a {}, not the type asked for", key, child(key)->name()));
    return p;
  }
  bool contains(const std::string& key) const { return hasChild(key); }
  size_t size() const { return namedChildren().size(); }
};

}  // namespace cohort::nn
