/*
 * Internal to ProcessGroup (process_group.cc): the argument checks every collective runs before it
 * reaches a backend, the fingerprint COHORT_DEBUG=DETAIL compares across ranks, and the text of the
 * op's flight-recorder entry ("[4, 8] float32; [2] int64", "op=sum root=0"), and how messages name
 * a rank ("1 (global rank 3)"). The checks and the text are on every op's path: they build no
 * string unless a check fails, and the text is appended into the recorder slot's own buffers.
 */
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>
#include <cohort/distributed/collective_options.h>
#include <cohort/distributed/debug/consistency_check.h>

namespace cohort::dist::op_args {

// Argument checks. Names are string_views of literals: nothing is built unless a check fails.
class Checker {
 public:
  Checker(OpType op, const std::string& group) : op_(op), group_(group) {}

  [[noreturn]] void fail(std::string_view what) const {
    throw ValueError(fmt::format("{} in group '{}': {}", opTypeName(op_), group_, what));
  }
  void tensor(const Tensor& t, std::string_view what) const {
    if (!t.defined()) fail(fmt::format("{} is undefined", what));
    if (t.numel() > 0 && !t.isContiguous()) {
      fail(fmt::format("{} must be contiguous, got shape {} with strides {}", what, shapeStr(t.sizes()),
                       shapeStr(t.strides())));
    }
  }
  void like(const Tensor& t, const Tensor& ref, std::string_view what, std::string_view refWhat) const {
    tensor(t, what);
    if (t.dtype() != ref.dtype() || t.sizes() != ref.sizes()) {
      fail(fmt::format("{} is {} {}, but {} is {} {}", what, dtypeName(t.dtype()), shapeStr(t.sizes()), refWhat,
                       dtypeName(ref.dtype()), shapeStr(ref.sizes())));
    }
    sameDevice(t, ref, what, refWhat);
  }
  void sameDtype(const Tensor& t, const Tensor& ref, std::string_view what, std::string_view refWhat) const {
    if (t.dtype() != ref.dtype()) {
      fail(fmt::format("{} has dtype {}, but {} has dtype {}", what, dtypeName(t.dtype()), refWhat,
                       dtypeName(ref.dtype())));
    }
    sameDevice(t, ref, what, refWhat);
  }
  void sameDevice(const Tensor& t, const Tensor& ref, std::string_view what, std::string_view refWhat) const {
    if (t.device() != ref.device()) {
      fail(fmt::format("{} is on {}, but {} is on {}", what, t.device(), refWhat, ref.device()));
    }
  }
  void count(size_t got, size_t want, std::string_view what) const {
    if (got != want) fail(fmt::format("expected {} {} (one per rank), got {}", want, what, got));
  }
  void rank(int r, int size, std::string_view what) const {
    if (r < 0 || r >= size) fail(fmt::format("{} {} is out of range for a group of size {}", what, r, size));
  }
  void reduction(ReduceOp op, const Tensor& t) const {
    if (op == ReduceOp::Avg && !isFloating(t.dtype())) {
      fail(fmt::format("reduction avg needs a floating-point tensor, got {}", dtypeName(t.dtype())));
    }
  }

 private:
  OpType op_;
  const std::string& group_;
};

// The cross-rank fingerprint of a call (COHORT_DEBUG=DETAIL), built only when the check runs.
std::function<CollectiveFingerprint()> fp(OpType op, std::vector<Tensor> ts, std::optional<ReduceOp> reduceOp = {},
                                          int root = -1);
// For ops whose shapes may differ between ranks: only the op and the dtype must agree.
std::function<CollectiveFingerprint()> fpDtypeOnly(OpType op, const Tensor& t);

// The flight recorder's text.
void appendShape(std::string& out, const Tensor& t);
void appendShapes(std::string& out, const std::vector<Tensor>& ts);
template <typename... Ts>
void appendShapes(std::string& out, const Tensor& first, const Ts&... rest) {
  appendShape(out, first);
  ((out += "; ", appendShape(out, rest)), ...);
}
void reduceDetail(std::string& out, ReduceOp op);
std::string rootDetail(int root);

// How messages name a rank of the group: "1", or "1 (global rank 3)" in a subgroup (send/recv
// labels, the hang diagnosis of debug/detail/hang_diagnosis.h).
std::string rankName(int groupRank, const std::vector<int>& globalRanks);

}  // namespace cohort::dist::op_args
