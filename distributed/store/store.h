/*
 * Store: the key-value rendezvous every distributed part of cohort meets through (process group
 * setup, missing-rank diagnosis, the shared-memory backend's segment names, the launcher, RPC).
 *
 * Semantics (the same for every implementation):
 *  - set(k, v) stores bytes; get(k) waits until k exists (up to timeout()) and returns its value.
 *  - add(k, d) atomically adds d to the integer stored at k (missing = 0) and returns the result;
 *    integers are stored as their decimal text, so get() of an added key returns e.g. "3".
 *  - compareSet(k, expected, desired): if k is missing and expected is empty, or k holds
 *    `expected`, k becomes `desired`. Returns the value k holds afterwards (for a missing key with
 *    a non-empty `expected`, returns `expected` unchanged and stores nothing), as in c10d.
 *  - check(keys) says whether all keys exist, without waiting.
 *  - deleteKey(k) returns whether k existed. numKeys() counts keys (implementation keys excluded).
 *  - wait(keys, timeout) returns when all keys exist, or throws TimeoutError naming the keys that
 *    are still missing and the store.
 * Every blocking call has a deadline: the per-call timeout, or the store's default timeout().
 * Failures to reach a store are StoreError naming where it is (host:port, path).
 * Thread-safe: any thread may call any method.
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/util/error.h>

namespace cohort::dist {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

inline constexpr Millis kDefaultStoreTimeout{300'000};  // 5 minutes, as c10d

class Store {
 public:
  explicit Store(Millis timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool deleteKey(const std::string& key) = 0;
  virtual int64_t numKeys() = 0;
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // A short description for messages: "TCPStore(10.0.0.1:29500)", "FileStore(/tmp/x)".
  virtual std::string describe() const = 0;

  Millis timeout() const { return timeout_; }
  void setTimeout(Millis t) { timeout_ = t; }

  // String conveniences.
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string getString(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  Millis timeout_;
};

using StorePtr = std::shared_ptr<Store>;

}  // namespace cohort::dist
