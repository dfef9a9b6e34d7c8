/*
 * A group's abort signal: how one rank whose backend broke (a dead peer, a timeout, an abort)
 * makes every rank of the group stop, including ranks blocked on a live peer that would otherwise
 * sit out their whole timeout. The first rank to fail writes "abort" in the backend's store
 * (first writer wins, so every rank quotes the root cause); the other ranks' backends read it
 * while they have an op in flight and fail it, and every later op, with that cause.
 *
 * Used by the watchdog of the communicator backends (watchdog/watchdog.h) and by the gloo backend,
 * whose transport does not wake a send that was partly written when its connection broke.
 * The value is "<timeout|error> <rank>\n<message>".
 */
#pragma once

#include <optional>
#include <string>

#include <cohort/distributed/store/store.h>

namespace cohort::dist::detail {

struct AbortSignal {
  bool timeout = false;  // the root cause was a timeout: ranks that stop for it report a TimeoutError
  int from = -1;         // the rank that wrote it
  std::string message;   // its error
};

// Writes the signal unless a rank wrote one before. A store that cannot be written is logged (the
// other ranks then see their own error or timeout), never thrown: the caller is already failing.
void raiseAbortSignal(Store& store, const std::string& group, int rank, bool timeout, const std::string& message);

// The signal, once some rank raised it; nullopt before, or when the store cannot be read (logged
// at Debug: a store whose host died is read again at the next poll).
std::optional<AbortSignal> readAbortSignal(Store& store, const std::string& group);

}  // namespace cohort::dist::detail
