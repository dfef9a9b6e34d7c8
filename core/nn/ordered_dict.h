/*
 * OrderedDict: string keys in insertion order with O(1) lookup. Modules keep their parameters,
 * buffers and children in these so every traversal (names, state dicts, optimizer order) is
 * deterministic and follows registration order, as PyTorch's do.
 * Not thread-safe; owned by value by whoever holds it.
 */
#pragma once

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::nn {

template <typename V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;
  using iterator = typename std::vector<Item>::iterator;
  using const_iterator = typename std::vector<Item>::const_iterator;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<Item> items) {
    for (const Item& it : items) insert(it.first, it.second);
  }

  // Adds a new key; a key that is already present is a ValueError.
  V& insert(const std::string& key, V value) {
    if (index_.count(key)) throw ValueError(fmt::format("OrderedDict: key '{}' is already present", key));
    index_.emplace(key, items_.size());
    items_.emplace_back(key, std::move(value));
    return items_.back().second;
  }
  // Adds or replaces (keeping the original position when replacing).
  V& set(const std::string& key, V value) {
    auto it = index_.find(key);
    if (it != index_.end()) return items_[it->second].second = std::move(value);
    return insert(key, std::move(value));
  }
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  V* find(const std::string& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V* find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  // A missing key is an IndexError naming the key, what the dict is (see describeAs) and its keys.
  V& at(const std::string& key) {
    V* v = find(key);
    if (!v) throw IndexError(missingKeyMessage(key));
    return *v;
  }
  const V& at(const std::string& key) const { return const_cast<OrderedDict*>(this)->at(key); }
  V& operator[](const std::string& key) { return at(key); }
  const V& operator[](const std::string& key) const { return at(key); }
  // Removes a key (later items keep their relative order). Returns whether it was present.
  bool erase(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    size_t pos = it->second;
    items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(pos));
    index_.erase(it);
    for (auto& [k, i] : index_)
      if (i > pos) --i;
    return true;
  }

  // What this dict is and what its keys name, for the error of a missing key: a safetensors load
  // says describeAs("safetensors file 'w.safetensors'", "tensor"), and at("x") then throws
  // "safetensors file 'w.safetensors' has no tensor 'x' (it has 2: a, b)". Copies keep it.
  void describeAs(std::string what, std::string keyNoun = "key") {
    what_ = std::move(what);
    keyNoun_ = std::move(keyNoun);
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  void clear() {
    items_.clear();
    index_.clear();
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const Item& it : items_) out.push_back(it.first);
    return out;
  }
  std::vector<V> values() const {
    std::vector<V> out;
    out.reserve(items_.size());
    for (const Item& it : items_) out.push_back(it.second);
    return out;
  }
  const std::vector<Item>& items() const { return items_; }
  Item& item(size_t i) { return items_.at(i); }
  const Item& item(size_t i) const { return items_.at(i); }

  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  std::string missingKeyMessage(const std::string& key) const {
    std::string have;
    const size_t shown = std::min<size_t>(items_.size(), 16);
    for (size_t i = 0; i < shown; ++i) have += (i ? ", " : "") + items_[i].first;
    if (items_.size() > shown) have += fmt::format(", and {} more", items_.size() - shown);
    return fmt::format("{} has no {} '{}' ({})", what_.empty() ? "OrderedDict" : what_, keyNoun_, key,
                       items_.empty() ? "it is empty" : fmt::format("it has {}: {}", items_.size(), have));
  }

  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
  std::string what_;
  std::string keyNoun_ = "key";
};

}  // namespace cohort::nn
