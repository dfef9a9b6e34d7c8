#include <cohort/distributed/store/hash_store.h>

#include <cohort/distributed/store/detail/store_util.h>

namespace cohort::dist {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  Millis timeout = timeout_;
  auto deadline = detail::deadlineAfter(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return data_.count(key) > 0; })) {
    detail::throwGetTimeout(describe(), timeout, key);
  }
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    int64_t current = it == data_.end() ? 0 : detail::parseStoredInt(it->second, describe() + " key \"" + key + "\"");
    result = current + delta;
    data_[key] = detail::formatStoredInt(result);
  }
  cv_.notify_all();
  return result;
}

Bytes HashStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;
    data_[key] = desired;
  } else if (it->second == expected) {
    it->second = desired;
  } else {
    return it->second;
  }
  lock.unlock();
  cv_.notify_all();
  return desired;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return missingLocked(keys).empty();
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t HashStore::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

void HashStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  auto deadline = detail::deadlineAfter(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return missingLocked(keys).empty(); })) {
    detail::throwWaitTimeout(describe(), timeout, missingLocked(keys), keys.size());
  }
}

std::vector<std::string> HashStore::missingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing.push_back(k);
  return missing;
}

}  // namespace cohort::dist
