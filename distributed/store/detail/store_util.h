/*
 * Helpers shared by the Store implementations (not part of the public interface): deadlines that
 * do not overflow for huge timeouts, the integer text that add() reads and writes, and the
 * messages of the errors every store raises, so all stores word them the same way.
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <cohort/distributed/store/store.h>

namespace cohort::dist::detail {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating: Millis::max() (or anything past the clock's range) never expires.
Clock::time_point deadlineAfter(Millis timeout);

// The decimal integer add() keeps at a key; `what` names the store and key for the ValueError
// raised when the stored bytes are not an integer.
int64_t parseStoredInt(const Bytes& value, const std::string& what);
Bytes formatStoredInt(int64_t v);

// "a", "b", "c" (quoted, comma separated, at most 16 shown then "... and N more").
std::string formatKeys(const std::vector<std::string>& keys);

// "<store>: wait timed out after <t> ms; still missing N of M keys: ..."
[[noreturn]] void throwWaitTimeout(const std::string& store, Millis timeout, const std::vector<std::string>& missing,
                                   size_t total);
// "<store>: get("k") timed out after <t> ms waiting for the key to be set"
[[noreturn]] void throwGetTimeout(const std::string& store, Millis timeout, const std::string& key);

}  // namespace cohort::dist::detail
