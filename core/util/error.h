/*
 * cohort's error types. Two tiers (docs/errors.md):
 *  - recoverable, typed errors a caller may catch and act on (Error and its subclasses);
 *  - broken invariants and bad arguments, raised by COHORT_CHECK* (check.h) as Error with
 *    file:line.
 * The libraries throw rather than exit or abort, and errors raised on background threads travel
 * as std::exception_ptr to whoever waits. The one exception is deliberate: the mpi backend ends
 * the job with MPI_Abort when a collective on its caller's thread passes its deadline, since MPI
 * cannot interrupt it (distributed/mpi/mpi_backend.h).
 */
#pragma once

#include <stdexcept>
#include <string>

namespace cohort {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Bad shapes, dtypes, dims or indices handed to an op.
class ValueError : public Error {
  using Error::Error;
};
// An index out of range (a dim, an element, a class label).
class IndexError : public ValueError {
  using ValueError::ValueError;
};
// A feature this build or this device does not have (CUDA on a CPU build, an unsupported op).
class NotSupportedError : public Error {
  using Error::Error;
};

// Distributed errors: the message names the op, group, sequence number and ranks involved.
class DistError : public Error {
  using Error::Error;
};
class TimeoutError : public DistError {
  using DistError::DistError;
};
class PeerError : public DistError {
  using DistError::DistError;
};
class StoreError : public DistError {
  using DistError::DistError;
};

class CheckpointError : public Error {
  using Error::Error;
};
class RpcError : public Error {
  using Error::Error;
};
// An RPC whose deadline passed before its response arrived.
class RpcTimeoutError : public RpcError {
  using RpcError::RpcError;
};

}  // namespace cohort
