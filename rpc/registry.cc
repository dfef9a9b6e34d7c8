#include <cohort/rpc/registry.h>

#include <cohort/core/util/check.h>

namespace cohort::rpc {

FunctionRegistry& FunctionRegistry::global() {
  static FunctionRegistry r;
  return r;
}

void FunctionRegistry::add(RegisteredFunction f) {
  if (f.name.empty()) throw ValueError("rpc::registerFunction: the name is empty");
  auto p = std::make_shared<const RegisteredFunction>(std::move(f));
  std::unique_lock lock(mu_);
  fns_[p->name] = std::move(p);
}

bool FunctionRegistry::remove(const std::string& name) {
  std::unique_lock lock(mu_);
  return fns_.erase(name) > 0;
}

std::shared_ptr<const RegisteredFunction> FunctionRegistry::find(const std::string& name) const {
  std::shared_lock lock(mu_);
  auto it = fns_.find(name);
  return it == fns_.end() ? nullptr : it->second;
}

std::vector<std::string> FunctionRegistry::names() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [k, v] : fns_) out.push_back(k);
  return out;
}

void registerRawFunction(const std::string& name, std::string signature, Handler handler) {
  FunctionRegistry::global().add({name, std::move(signature), std::move(handler)});
}

}  // namespace cohort::rpc
