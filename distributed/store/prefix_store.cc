#include <cohort/distributed/store/prefix_store.h>

#include <fmt/format.h>

#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/store/detail/store_util.h>

namespace cohort::dist {

PrefixStore::PrefixStore(std::string prefix, StorePtr store)
    : Store(store ? store->timeout() : kDefaultStoreTimeout), prefix_(std::move(prefix)), store_(std::move(store)) {
  COHORT_CHECK_T(ValueError, store_ != nullptr, "PrefixStore(\"{}\") needs a store to wrap, got null", prefix_);
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(join(key), value); }

Bytes PrefixStore::get(const std::string& key) {
  std::string full = join(key);
  Millis timeout = timeout_;
  try {
    if (timeout != store_->timeout()) store_->wait({full}, timeout);
    return store_->get(full);
  } catch (const TimeoutError&) {
    detail::throwGetTimeout(describe(), timeout, key);
  }
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return store_->add(join(key), delta); }

Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return store_->compareSet(join(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(join(keys)); }

bool PrefixStore::deleteKey(const std::string& key) { return store_->deleteKey(join(key)); }

int64_t PrefixStore::numKeys() { return store_->numKeys(); }

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  try {
    store_->wait(join(keys), timeout);
  } catch (const TimeoutError&) {
    // Name the keys as this store's caller knows them: which are still missing, asked key by key
    // (a wrapped store that cannot answer that either leaves them all in doubt).
    std::vector<std::string> missing;
    try {
      for (const auto& k : keys)
        if (!store_->check({join(k)})) missing.push_back(k);
    } catch (const Error&) {
      missing = keys;
    }
    detail::throwWaitTimeout(describe(), timeout, missing, keys.size());
  }
}

std::string PrefixStore::describe() const {
  return fmt::format("PrefixStore(\"{}\" in {})", prefix_, store_->describe());
}

}  // namespace cohort::dist
