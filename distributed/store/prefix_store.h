/*
 * PrefixStore: a view of another store in which every key is "<prefix>/<key>", so subgroups,
 * backends and the launcher share one store without colliding. It owns no data: every call goes
 * straight to the wrapped store, and it is as thread-safe as that store.
 * numKeys() reports the wrapped store's count (all prefixes), as c10d's PrefixStore does: the
 * Store interface has no way to list keys, and counting per prefix would need one.
 * The timeout starts as the wrapped store's; when set differently, get() waits for the key with
 * this store's timeout before reading it.
 */
#pragma once

#include <cohort/distributed/store/store.h>

namespace cohort::dist {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, StorePtr store);

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
  std::string describe() const override;

  const std::string& prefix() const { return prefix_; }
  const StorePtr& underlying() const { return store_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  StorePtr store_;
};

}  // namespace cohort::dist
