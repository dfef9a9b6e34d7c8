// The profiler's table: spans added up by name (and input shapes), printed as PyTorch's
// key_averages().table() prints them.
#include <algorithm>
#include <map>

#include <cohort/core/profiler/detail/session.h>
#include <cohort/core/util/check.h>

namespace cohort::profiler {

namespace detail {

std::string formatBytes(int64_t bytes) {
  constexpr double kKb = 1024.0, kMb = 1024.0 * kKb, kGb = 1024.0 * kMb;
  const double a = std::abs(static_cast<double>(bytes));
  if (a >= kGb) return fmt::format("{:.2f} Gb", static_cast<double>(bytes) / kGb);
  if (a >= kMb) return fmt::format("{:.2f} Mb", static_cast<double>(bytes) / kMb);
  if (a >= kKb) return fmt::format("{:.2f} Kb", static_cast<double>(bytes) / kKb);
  return fmt::format("{} b", bytes);
}

}  // namespace detail

namespace {

std::string formatTime(int64_t ns) {
  const double us = static_cast<double>(ns) / 1e3;
  if (us >= 1e6) return fmt::format("{:.3f}s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.3f}ms", us / 1e3);
  return fmt::format("{:.3f}us", us);
}

std::string percent(int64_t part, int64_t whole) {
  return fmt::format("{:.2f}%", whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
}

}  // namespace

std::vector<OpStats> Profile::keyAverages(bool groupByShapes) {
  const std::vector<Event>& ev = events();
  // Self time: the span's duration less its children's on the same thread.
  std::vector<int64_t> childNs(ev.size(), 0);
  for (const Event& e : ev)
    if (e.parent >= 0) childNs[static_cast<size_t>(e.parent)] += e.durationNs();
  std::map<std::pair<std::string, std::string>, OpStats> rows;
  std::vector<std::pair<std::string, std::string>> order;
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    if (e.kind == EventKind::Step) continue;
    auto key = std::make_pair(e.name, groupByShapes ? e.shapes : std::string());
    auto [it, fresh] = rows.try_emplace(key);
    OpStats& r = it->second;
    if (fresh) {
      r.name = e.name;
      r.shapes = key.second;
      r.kind = e.kind;
      order.push_back(key);
    }
    r.calls += 1;
    r.totalNs += e.durationNs();
    r.selfNs += std::max<int64_t>(0, e.durationNs() - childNs[i]);
    r.selfMemBytes += e.allocBytes - e.freedBytes;
    r.totalMemBytes += e.totalAllocBytes - e.totalFreedBytes;
  }
  std::vector<OpStats> out;
  out.reserve(order.size());
  for (const auto& k : order) out.push_back(rows[k]);
  return out;
}

std::string Profile::table(TableOptions opts) {
  if (opts.rowLimit < 0) throw ValueError(fmt::format("Profile::table: rowLimit must be >= 0, got {}", opts.rowLimit));
  std::vector<OpStats> rows = keyAverages(opts.groupByShapes);
  auto key = [&](const OpStats& r) -> int64_t {
    switch (opts.sortBy) {
      case SortBy::SelfCpuTime: return r.selfNs;
      case SortBy::CpuTime: return r.totalNs;
      case SortBy::SelfMemory: return r.selfMemBytes;
      case SortBy::Memory: return r.totalMemBytes;
      case SortBy::Calls: return r.calls;
      case SortBy::Name: return 0;
    }
    return 0;
  };
  if (opts.sortBy == SortBy::Name)
    std::stable_sort(rows.begin(), rows.end(), [](const OpStats& a, const OpStats& b) { return a.name < b.name; });
  else std::stable_sort(rows.begin(), rows.end(), [&](const OpStats& a, const OpStats& b) { return key(a) > key(b); });
  int64_t selfTotal = 0;
  for (const OpStats& r : rows) selfTotal += r.selfNs;
  if (opts.rowLimit > 0 && rows.size() > static_cast<size_t>(opts.rowLimit))
    rows.resize(static_cast<size_t>(opts.rowLimit));

  size_t nameWidth = 4;
  for (const OpStats& r : rows) nameWidth = std::max(nameWidth, r.name.size());
  nameWidth = std::min<size_t>(nameWidth, 55);
  std::vector<std::string> header = {"Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"};
  if (opts_.memory) {
    header.push_back("CPU Mem");
    header.push_back("Self CPU Mem");
  }
  header.push_back("# of Calls");
  constexpr size_t kCol = 12;
  std::string rule(nameWidth, '-');
  for (size_t i = 0; i < header.size(); ++i) rule += "  " + std::string(kCol, '-');
  size_t shapesWidth = 0;
  if (opts.groupByShapes) {
    shapesWidth = 12;
    for (const OpStats& r : rows) shapesWidth = std::max(shapesWidth, std::min<size_t>(r.shapes.size(), 60));
    rule += "  " + std::string(shapesWidth, '-');
  }
  auto clip = [](const std::string& s, size_t w) { return s.size() <= w ? s : s.substr(0, w - 3) + "..."; };
  std::string out = rule + "\n";
  out += fmt::format("{:>{}}", "Name", nameWidth);
  for (const std::string& h : header) out += fmt::format("  {:>{}}", h, kCol);
  if (opts.groupByShapes) out += fmt::format("  {:<{}}", "Input Shapes", shapesWidth);
  out += "\n" + rule + "\n";
  for (const OpStats& r : rows) {
    out += fmt::format("{:>{}}", clip(r.name, nameWidth), nameWidth);
    std::vector<std::string> cells = {percent(r.selfNs, selfTotal), formatTime(r.selfNs), percent(r.totalNs, selfTotal),
                                      formatTime(r.totalNs), formatTime(r.calls > 0 ? r.totalNs / r.calls : 0)};
    if (opts_.memory) {
      cells.push_back(detail::formatBytes(r.totalMemBytes));
      cells.push_back(detail::formatBytes(r.selfMemBytes));
    }
    cells.push_back(std::to_string(r.calls));
    for (const std::string& c : cells) out += fmt::format("  {:>{}}", c, kCol);
    if (opts.groupByShapes) out += fmt::format("  {:<{}}", clip(r.shapes, 60), shapesWidth);
    out += "\n";
  }
  out += rule + "\n";
  out += fmt::format("Self CPU time total: {}\n", formatTime(selfTotal));
  return out;
}

}  // namespace cohort::profiler
