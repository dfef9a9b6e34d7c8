/*
 * Node identity: which ranks of a group share a host. Every rank names its node (the option
 * ProcessGroupOptions::nodeId / BackendOptions::nodeId when set, else COHORT_NODE_ID, else the
 * hostname) and publishes it through the group's store; ranks with equal names are one node.
 * ProcessGroup's "auto" backend choice and the hierarchical backend read it. Ranks that are
 * threads of one process simulate several nodes through the option (an environment variable is
 * process-wide). Called on the thread that creates the group.
 */
#pragma once

#include <string>
#include <vector>

#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/store/store.h>

namespace cohort::dist {

// `configured` when not empty, else COHORT_NODE_ID when set, else this host's name.
std::string localNodeId(const std::string& configured);

// Every rank sets "<prefix><rank>" to its node id and reads everyone's (waiting up to `timeout`;
// StoreError/TimeoutError from the store when a rank never publishes). Collective over the group.
std::vector<std::string> exchangeNodeIds(Store& store, const std::string& prefix, int rank, int size,
                                         const std::string& mine, Millis timeout);

// The nodes of a group: ranks grouped by node id, nodes ordered by their lowest rank, ranks of a
// node ascending (so each node's leader, its lowest rank, is local rank 0).
struct NodeLayout {
  std::vector<std::vector<int>> nodes;  // node index -> its ranks
  std::vector<int> nodeOf;              // rank -> node index
  std::vector<int> localRank;           // rank -> its index within its node
  static NodeLayout fromIds(const std::vector<std::string>& ids);
  int numNodes() const { return static_cast<int>(nodes.size()); }
  size_t maxNodeSize() const;
};

}  // namespace cohort::dist
