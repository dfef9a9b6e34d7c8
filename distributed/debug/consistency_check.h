/*
 * COHORT_DEBUG=DETAIL's cross-rank check: before a collective runs, every rank publishes what it
 * is about to call (op, dtype, shapes, reduction, root) in the group's store and reads everyone
 * else's. When they differ, every rank throws the same DistError, one line per rank, so the bug
 * (a rank that skipped a collective, a shape that depends on the rank...) is found on the first
 * mismatching call instead of as a hang or silently wrong numbers.
 *
 * Put in the fingerprint only what must agree on every rank: e.g. alltoall's uneven split sizes
 * and gather's root-only output list legitimately differ, so leave them out.
 *
 * Store keys: "cohort_debug/<group>/<seq>/<rank>". A rank at sequence number s deletes its own
 * key of s - 2: passing the check at s - 1 means every rank published s - 1, which each does only
 * after reading every key of s - 2. Keys therefore do not pile up over a long job.
 *
 * Called by ProcessGroup on the thread that issues the collective; costs one store set, one wait
 * and `size` gets per collective, so it is for debugging only.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/store/store.h>

namespace cohort::dist {

struct CollectiveFingerprint {
  OpType op = OpType::Allreduce;
  std::string dtype;                         // "float32"; several tensors: "float32, int64"
  std::vector<std::vector<int64_t>> shapes;  // one per tensor the op takes part with
  std::optional<ReduceOp> reduceOp;
  int root = -1;  // -1: the op has no root

  // "allreduce(dtype=float32, shapes=[[4, 8]], op=sum)"; the text ranks compare.
  std::string describe() const;
};

// Throws DistError on every rank when the ranks' fingerprints differ (message: the group, the
// sequence number and each rank's call, the differing ones marked), TimeoutError naming the ranks
// that did not publish within `timeout`.
void checkCollectiveConsistency(Store& store, const std::string& groupName, int rank, int size, uint64_t seq,
                                const CollectiveFingerprint& fingerprint, Millis timeout);

}  // namespace cohort::dist
