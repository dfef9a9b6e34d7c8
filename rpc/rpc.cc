#include <cohort/rpc/rpc.h>

#include <cohort/distributed/init.h>
#include <cohort/distributed/store/prefix_store.h>

namespace cohort::rpc {

AgentFactory findAgentFactory(const std::string& kind);  // agent.cc

namespace {
std::mutex gMu;
AgentPtr gAgent;
}  // namespace

AgentPtr init(const std::string& name, int rank, int worldSize, RpcOptions options) {
  std::lock_guard<std::mutex> lock(gMu);
  if (gAgent) throw RpcError(fmt::format("rpc::init: worker '{}' already runs in this process", gAgent->self().name));
  if (!options.store) {
    if (!dist::isInitialized()) {
      throw ValueError("rpc::init: give options.store, or call dist::initProcessGroup() first to use its store");
    }
    options.store = std::make_shared<dist::PrefixStore>("rpc", dist::defaultProcessGroup()->store());
  }
  AgentFactory factory = findAgentFactory(options.agent);
  if (!factory) {
    std::string kinds;
    for (const auto& k : agentKinds()) kinds += (kinds.empty() ? "" : ", ") + k;
    throw NotSupportedError(fmt::format("rpc::init: no RPC agent '{}' in this build (built: {})", options.agent,
                                        kinds.empty() ? "none; configure with COHORT_USE_TENSORPIPE=ON" : kinds));
  }
  gAgent = factory(name, rank, worldSize, std::move(options));
  return gAgent;
}

void shutdown(bool graceful) {
  AgentPtr a;
  {
    std::lock_guard<std::mutex> lock(gMu);
    a = gAgent;
  }
  if (!a) return;
  // The agent stays current while it drains: functions still running may make nested calls.
  struct Forget {
    AgentPtr& a;
    ~Forget() {
      std::lock_guard<std::mutex> lock(gMu);
      if (gAgent == a) gAgent.reset();
    }
  } forget{a};
  a->shutdown(graceful);
}

AgentPtr currentAgent() {
  std::lock_guard<std::mutex> lock(gMu);
  if (!gAgent) throw RpcError("rpc: no agent runs in this process (call rpc::init first)");
  return gAgent;
}
bool isInitialized() {
  std::lock_guard<std::mutex> lock(gMu);
  return gAgent != nullptr;
}
WorkerInfo getWorkerInfo(const std::string& name) { return currentAgent()->worker(name); }
WorkerInfo getWorkerInfo() { return currentAgent()->self(); }

}  // namespace cohort::rpc
