#include <cohort/distributed/detail/op_args.h>

#include <algorithm>
#include <charconv>

#include <fmt/ranges.h>

namespace cohort::dist::op_args {

std::function<CollectiveFingerprint()> fp(OpType op, std::vector<Tensor> ts, std::optional<ReduceOp> reduceOp,
                                          int root) {
  return [=] {
    CollectiveFingerprint f;
    f.op = op;
    std::vector<std::string> dtypes;
    for (const Tensor& t : ts) {
      std::string d = dtypeName(t.dtype());
      if (std::find(dtypes.begin(), dtypes.end(), d) == dtypes.end()) dtypes.push_back(d);
      f.shapes.push_back(t.sizes());
    }
    f.dtype = fmt::format("{}", fmt::join(dtypes, ", "));
    f.reduceOp = reduceOp;
    f.root = root;
    return f;
  };
}
std::function<CollectiveFingerprint()> fpDtypeOnly(OpType op, const Tensor& t) {
  return [op, d = t.dtype()] {
    CollectiveFingerprint f;
    f.op = op;
    f.dtype = dtypeName(d);
    return f;
  };
}

// Written into the flight-recorder slot's own buffer: no temporary, no allocation.
void reduceDetail(std::string& out, ReduceOp op) {
  out.assign("op=");
  out.append(reduceOpName(op));
}
std::string rootDetail(int root) { return "root=" + std::to_string(root); }

std::string rankName(int groupRank, const std::vector<int>& globalRanks) {
  int g = groupRank >= 0 && groupRank < static_cast<int>(globalRanks.size()) ? globalRanks[groupRank] : groupRank;
  return g == groupRank ? fmt::format("{}", groupRank) : fmt::format("{} (global rank {})", groupRank, g);
}

// "[4, 8] float32; [2] int64": the flight recorder's shapes text, appended in place with
// std::to_chars (the hot path: no formatting library, no allocation once `out` has capacity).
void appendShape(std::string& out, const Tensor& t) {
  if (!t.defined()) {
    out += "undefined";
    return;
  }
  out += '[';
  char buf[24];
  const auto& sizes = t.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ", ";
    auto r = std::to_chars(buf, buf + sizeof(buf), sizes[i]);
    out.append(buf, r.ptr);
  }
  out += "] ";
  out += dtypeName(t.dtype());
}
void appendShapes(std::string& out, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) out += "; ";
    appendShape(out, ts[i]);
  }
}

}  // namespace cohort::dist::op_args
