/*
 * GlooStoreAdapter: cohort's Store seen through gloo's rendezvous::Store interface, so gloo's
 * connectFullMesh meets the other ranks through whatever store the process group uses (hash,
 * file, TCP, prefixed). Every wait has a deadline: the one gloo passes, or the adapter's.
 * Called by the thread that creates the gloo context.
 */
#pragma once

#include <gloo/rendezvous/store.h>

#include <cohort/distributed/store/store.h>

namespace cohort::dist::gloo_backend {

class GlooStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(StorePtr store, Millis timeout) : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    Bytes b = store_->get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  StorePtr store_;
  Millis timeout_;
};

}  // namespace cohort::dist::gloo_backend
