#include <cohort/distributed/debug/consistency_check.h>

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/error.h>

namespace cohort::dist {
namespace {

std::string checkKey(const std::string& group, uint64_t seq, int rank) {
  return fmt::format("cohort_debug/{}/{}/{}", group, seq, rank);
}

}  // namespace

std::string CollectiveFingerprint::describe() const {
  std::vector<std::string> shapeTexts;
  shapeTexts.reserve(shapes.size());
  for (const auto& s : shapes) shapeTexts.push_back(fmt::format("[{}]", fmt::join(s, ", ")));
  std::string out =
      fmt::format("{}(dtype={}, shapes=[{}]", opTypeName(op), dtype.empty() ? "-" : dtype, fmt::join(shapeTexts, ", "));
  if (reduceOp) out += fmt::format(", op={}", reduceOpName(*reduceOp));
  if (root >= 0) out += fmt::format(", root={}", root);
  out += ")";
  return out;
}

void checkCollectiveConsistency(Store& store, const std::string& groupName, int rank, int size, uint64_t seq,
                                const CollectiveFingerprint& fingerprint, Millis timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ValueError(fmt::format("checkCollectiveConsistency: rank {} is out of range for size {} (group '{}')", rank,
                                 size, groupName));
  }
  const std::string mine = fingerprint.describe();
  store.set(checkKey(groupName, seq, rank), mine);
  if (seq > 2) store.deleteKey(checkKey(groupName, seq - 2, rank));  // safe: see the header

  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(checkKey(groupName, seq, r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(fmt::format(
        "COHORT_DEBUG=DETAIL check of {} #{} in group '{}' timed out after {} ms: ranks [{}] did not reach it "
        "(this is rank {}; its call: {})",
        opTypeName(fingerprint.op), seq, groupName, timeout.count(), fmt::join(missing, ", "), rank, mine));
  }

  std::vector<std::string> calls(size);
  std::map<std::string, int> votes;
  for (int r = 0; r < size; ++r) {
    calls[r] = r == rank ? mine : store.getString(keys[r]);
    ++votes[calls[r]];
  }
  if (votes.size() == 1) return;

  // Mark the calls that differ from the most common one (rank 0's on a tie).
  std::string common = calls[0];
  for (const auto& [call, n] : votes) {
    if (n > votes[common]) common = call;
  }
  std::string lines;
  for (int r = 0; r < size; ++r) {
    lines += fmt::format("\n  rank {}: {}{}", r, calls[r], calls[r] == common ? "" : "   <-- differs");
  }
  throw DistError(
      fmt::format("collective mismatch in group '{}' at sequence number {} (COHORT_DEBUG=DETAIL): the ranks called "
                  "different collectives or arguments:{}",
                  groupName, seq, lines));
}

}  // namespace cohort::dist
