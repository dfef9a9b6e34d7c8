#include <cohort/core/optim/factory.h>

#include <map>
#include <mutex>

#include <cohort/core/optim/adam.h>
#include <cohort/core/optim/sgd.h>

namespace cohort::optim {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, OptimizerFactory> factories{
      {"SGD", [](std::vector<ParamGroup> g) { return std::make_unique<SGD>(std::move(g)); }},
      {"Adam", [](std::vector<ParamGroup> g) { return std::make_unique<Adam>(std::move(g)); }},
      {"AdamW", [](std::vector<ParamGroup> g) { return std::make_unique<AdamW>(std::move(g)); }},
  };
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const std::string& type, std::vector<Tensor> params,
                                         const GroupOptions& options) {
  return makeOptimizer(type, std::vector<ParamGroup>{{std::move(params), options}});
}

std::unique_ptr<Optimizer> makeOptimizer(const std::string& type, std::vector<ParamGroup> groups) {
  OptimizerFactory f;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(type);
    if (it == r.factories.end()) {
      std::vector<std::string> known;
      for (const auto& [k, unused] : r.factories) known.push_back(k);
      throw ValueError(fmt::format("unknown optimizer type '{}' (known: {})", type, fmt::join(known, ", ")));
    }
    f = it->second;
  }
  return f(std::move(groups));
}

void registerOptimizer(const std::string& type, OptimizerFactory factory) {
  if (type.empty()) throw ValueError("registerOptimizer: the type name is empty");
  if (!factory) throw ValueError(fmt::format("registerOptimizer: the factory for '{}' is empty", type));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[type] = std::move(factory);
}

std::vector<std::string> optimizerTypes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [k, f] : r.factories) out.push_back(k);
  return out;
}

}  // namespace cohort::optim
