#include <cohort/rpc/distributed_optimizer.h>

#include <map>
#include <mutex>

#include <cohort/core/optim/factory.h>

namespace cohort::rpc {
namespace {

// The local optimizers this worker holds for DistributedOptimizers, by (creator rank, number).
struct Local {
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<RRef<Tensor>> params;  // keep the values owned here alive
  std::weak_ptr<RpcAgent> agent;     // the agent it was made under
};
struct Table {
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<Local>> locals;
  int64_t next = 1;
};
Table& table() {
  static Table t;
  return t;
}
// Held across every local optimizer's step on this worker: the optimizers of several trainers
// (several DistributedOptimizers) may hold the same parameter, and an update is a read-modify-write.
std::mutex& stepMutex() {
  static std::mutex mu;
  return mu;
}

std::shared_ptr<Local> findLocal(int64_t id) {
  std::lock_guard<std::mutex> lock(table().mu);
  auto it = table().locals.find(id);
  if (it == table().locals.end())
    throw ValueError(fmt::format("no local optimizer {} here (its DistributedOptimizer was destroyed)", id));
  return it->second;
}

const bool kRegistered = [] {
  // Groups: [(options, params)], options already merged with the optimizer's.
  using Group = std::tuple<std::map<std::string, double>, std::vector<RRef<Tensor>>>;
  registerFunction("cohort.dist_optim.create", [](std::string type, std::vector<Group> groups) -> int64_t {
    auto local = std::make_shared<Local>();
    std::vector<optim::ParamGroup> pgs;
    for (auto& [options, params] : groups) {
      optim::ParamGroup pg;
      pg.options = optim::GroupOptions(options.begin(), options.end());
      for (auto& p : params) {
        if (!p.isOwner())
          throw ValueError(fmt::format("a parameter is owned by worker '{}', not here", p.owner().name));
        Tensor t = p.toHere();
        if (!t.isLeaf() || !t.requiresGrad())
          throw ValueError(
              fmt::format("a parameter (shape {}) is not a leaf tensor that requires grad", shapeStr(t.sizes())));
        pg.params.push_back(t);
        local->params.push_back(p);
      }
      pgs.push_back(std::move(pg));
    }
    local->opt = optim::makeOptimizer(type, std::move(pgs));
    local->agent = currentAgent();
    std::vector<std::shared_ptr<Local>> stale;  // made under an agent that has shut down since
    std::lock_guard<std::mutex> lock(table().mu);
    for (auto it = table().locals.begin(); it != table().locals.end();) {
      if (it->second->agent.lock() != local->agent.lock()) {
        stale.push_back(std::move(it->second));
        it = table().locals.erase(it);
      } else {
        ++it;
      }
    }
    int64_t id = table().next++;
    table().locals.emplace(id, std::move(local));
    return id;
  });
  registerFunction("cohort.dist_optim.step", [](int64_t id, autograd::ContextId ctx) {
    auto local = findLocal(id);
    autograd::Gradients grads = autograd::gradientsOf(ctx);
    std::lock_guard<std::mutex> lock(stepMutex());
    local->opt->step([&](const Tensor& p) { return grads.get(p); });
  });
  registerFunction("cohort.dist_optim.destroy", [](int64_t id) {
    std::shared_ptr<Local> dying;
    std::lock_guard<std::mutex> lock(table().mu);
    auto it = table().locals.find(id);
    if (it != table().locals.end()) {
      dying = std::move(it->second);
      table().locals.erase(it);
    }
  });
  return true;
}();

// Waits for every future; RpcError listing the failures (each already names its worker).
void waitAll(std::vector<Future<Value>>& fs, const std::string& what) {
  std::vector<std::string> errors;
  for (auto& f : fs) {
    if (auto e = (f.wait(), f.exception())) errors.push_back(describeException(e));
  }
  if (!errors.empty()) throw RpcError(fmt::format("{}: {}", what, fmt::join(errors, "; ")));
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(const std::string& type, const std::vector<RRef<Tensor>>& params,
                                           const optim::GroupOptions& options)
    : DistributedOptimizer(type, std::vector<DistributedParamGroup>{{params, {}}}, options) {}

DistributedOptimizer::DistributedOptimizer(const std::string& type, const std::vector<DistributedParamGroup>& groups,
                                           const optim::GroupOptions& options) {
  (void)kRegistered;
  auto agent = currentAgent();
  agent_ = agent;
  // owner -> its groups: (merged options, the group's parameters it owns)
  using Group = std::tuple<std::map<std::string, double>, std::vector<RRef<Tensor>>>;
  std::map<std::string, std::vector<Group>> byOwner;
  size_t count = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::map<std::string, double> merged(options.begin(), options.end());
    for (const auto& [k, v] : groups[g].options) merged[k] = v;
    std::map<std::string, std::vector<RRef<Tensor>>> mine;
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const RRef<Tensor>& p = groups[g].params[i];
      if (!p.defined())
        throw ValueError(fmt::format("DistributedOptimizer: parameter {} of group {} is undefined", i, g));
      mine[p.owner().name].push_back(p);
      ++count;
    }
    for (auto& [name, ps] : mine) byOwner[name].emplace_back(merged, std::move(ps));
  }
  if (count == 0) throw ValueError("DistributedOptimizer: no parameters");
  std::vector<std::string> names;
  std::vector<Future<Value>> created;
  for (auto& [name, gs] : byOwner) {
    names.push_back(name);
    created.push_back(agent->call(name, "cohort.dist_optim.create", List{Value(type), toValue(gs)}));
  }
  std::vector<std::string> errors;
  for (size_t i = 0; i < created.size(); ++i) {
    try {
      owners_.push_back({names[i], fromValue<int64_t>(created[i].value(), "optimizer id")});
    } catch (const std::exception& e) {
      errors.push_back(e.what());
    }
  }
  if (!errors.empty()) {
    destroyRemotes();  // the optimizers that were made
    throw RpcError(fmt::format("DistributedOptimizer({}): {}", type, fmt::join(errors, "; ")));
  }
}

DistributedOptimizer::~DistributedOptimizer() { destroyRemotes(); }

void DistributedOptimizer::destroyRemotes() noexcept {
  auto agent = agent_.lock();
  if (!agent || !agent->running()) return;
  for (const Owner& o : owners_) {
    try {
      agent->call(o.name, "cohort.dist_optim.destroy", List{Value(o.id)}).addCallback([](Future<Value> f) {
        (void)f.exception();
      });
    } catch (...) {
    }
  }
  owners_.clear();
}

void DistributedOptimizer::step(const autograd::Context& ctx) {
  if (ctx.ended())
    throw ValueError(
        fmt::format("DistributedOptimizer::step: distributed autograd context {} has ended", ctx.id().str()));
  step(ctx.id());
}

void DistributedOptimizer::step(autograd::ContextId ctx) {
  if (!ctx.valid()) throw ValueError("DistributedOptimizer::step: an invalid context id");
  auto agent = agent_.lock();
  if (!agent || !agent->running()) throw RpcError("DistributedOptimizer::step: the RPC agent has shut down");
  std::vector<Future<Value>> steps;
  steps.reserve(owners_.size());
  for (const Owner& o : owners_)
    steps.push_back(agent->call(o.name, "cohort.dist_optim.step", List{Value(o.id), toValue(ctx)}));
  waitAll(steps, fmt::format("DistributedOptimizer::step in context {}", ctx.str()));
}

std::vector<std::string> DistributedOptimizer::owners() const {
  std::vector<std::string> out;
  for (const Owner& o : owners_) out.push_back(o.name);
  return out;
}

}  // namespace cohort::rpc
