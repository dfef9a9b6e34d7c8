#include <cohort/distributed/topology.h>

#include <unistd.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kNodeIdKnob, "COHORT_NODE_ID", "",
                "This process's node name for grouping ranks by host (auto backend choice, hierarchical "
                "collectives); default: the hostname. Set it to simulate several nodes on one host");

std::string localNodeId(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (auto raw = kNodeIdKnob.raw(); raw && !raw->empty()) return *raw;
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::vector<std::string> exchangeNodeIds(Store& store, const std::string& prefix, int rank, int size,
                                         const std::string& mine, Millis timeout) {
  store.set(prefix + std::to_string(rank), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  store.wait(keys, timeout);
  std::vector<std::string> ids(size);
  for (int r = 0; r < size; ++r) ids[r] = r == rank ? mine : store.getString(keys[r]);
  return ids;
}

NodeLayout NodeLayout::fromIds(const std::vector<std::string>& ids) {
  NodeLayout l;
  std::map<std::string, int> index;
  l.nodeOf.resize(ids.size());
  l.localRank.resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    auto [it, fresh] = index.emplace(ids[r], static_cast<int>(l.nodes.size()));
    if (fresh) l.nodes.emplace_back();
    l.nodeOf[r] = it->second;
    l.localRank[r] = static_cast<int>(l.nodes[it->second].size());
    l.nodes[it->second].push_back(static_cast<int>(r));
  }
  return l;
}

size_t NodeLayout::maxNodeSize() const {
  size_t m = 0;
  for (const auto& n : nodes) m = std::max(m, n.size());
  return m;
}

}  // namespace cohort::dist
