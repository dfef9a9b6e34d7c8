/*
 * HashStore: the Store of one process, for ranks that run as threads (tests, single-process
 * multi-device jobs). A map under one mutex; get() and wait() block on a condition variable that
 * every write notifies, each up to its own deadline. Any thread may call any method.
 */
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include <cohort/distributed/store/store.h>

namespace cohort::dist {

class HashStore : public Store {
 public:
  explicit HashStore(Millis timeout = kDefaultStoreTimeout) : Store(timeout) {}

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string describe() const override { return "HashStore"; }

 private:
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

}  // namespace cohort::dist
