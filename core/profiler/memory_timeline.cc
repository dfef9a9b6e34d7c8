// Memory over a profile: the peak and what held it, and an HTML page (inline SVG, no scripts) of
// live CPU memory stacked by category over time.
#include <algorithm>
#include <map>
#include <unordered_map>

#include <cohort/core/profiler/detail/session.h>
#include <cohort/core/util/check.h>

namespace cohort::profiler {

namespace {

struct Block {
  std::string op;
  MemoryCategory category;
  int64_t bytes;
};

// Replays the memory events of `device` from the baseline, calling visit(i, live) after event i.
template <typename Visit>
void replay(const std::vector<MemoryEvent>& mem, const CategoryBytes& baseline, DeviceType device, Visit&& visit) {
  CategoryBytes live = device == DeviceType::CPU ? baseline : CategoryBytes{};
  for (size_t i = 0; i < mem.size(); ++i) {
    const MemoryEvent& m = mem[i];
    if (m.device.type() != device) continue;
    detail::applyMemoryEvent(live, m);
    visit(i, live);
  }
}

std::string htmlEscaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* kColors[kNumMemoryCategories] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"};

}  // namespace

MemoryPeak Profile::memoryPeak(DeviceType device) {
  const std::vector<MemoryEvent>& mem = memoryEvents();
  MemoryPeak peak;
  peak.byCategory = device == DeviceType::CPU ? baseline_ : CategoryBytes{};
  peak.bytes = peak.byCategory.total();
  int64_t peakIndex = -1;
  replay(mem, baseline_, device, [&](size_t i, const CategoryBytes& live) {
    if (live.total() > peak.bytes) {
      peak.bytes = live.total();
      peak.byCategory = live;
      peak.ns = mem[i].ns;
      peakIndex = static_cast<int64_t>(i);
    }
  });
  // What was live at the peak: blocks allocated during the profile by the span that made them,
  // and what was live before it started.
  std::unordered_map<uintptr_t, Block> blocks;
  CategoryBytes before = device == DeviceType::CPU ? baseline_ : CategoryBytes{};
  for (int64_t i = 0; i <= peakIndex; ++i) {
    const MemoryEvent& m = mem[static_cast<size_t>(i)];
    if (m.device.type() != device) continue;
    if (m.kind == MemoryEventKind::Alloc) {
      blocks[m.addr] = {m.op, m.category, m.bytes};
    } else if (m.kind == MemoryEventKind::Free) {
      auto it = blocks.find(m.addr);
      if (it != blocks.end()) blocks.erase(it);
      else before.bytes[static_cast<int>(m.category)] -= m.bytes;
    } else {
      auto it = blocks.find(m.addr);
      if (it != blocks.end()) {
        it->second.category = m.category;
      } else {
        before.bytes[static_cast<int>(m.from)] -= m.bytes;
        before.bytes[static_cast<int>(m.category)] += m.bytes;
      }
    }
  }
  std::map<std::pair<std::string, int>, MemoryPeak::Holder> holders;
  for (const auto& [addr, b] : blocks) {
    MemoryPeak::Holder& h = holders[{b.op, static_cast<int>(b.category)}];
    h.op = b.op;
    h.category = b.category;
    h.bytes += b.bytes;
    h.blocks += 1;
  }
  for (int c = 0; c < kNumMemoryCategories; ++c)
    if (before.bytes[c] > 0) {
      MemoryPeak::Holder& h = holders[{"", c}];
      h.category = static_cast<MemoryCategory>(c);
      h.bytes += before.bytes[c];
    }
  for (auto& [k, h] : holders) peak.holders.push_back(h);
  std::stable_sort(peak.holders.begin(), peak.holders.end(),
                   [](const MemoryPeak::Holder& a, const MemoryPeak::Holder& b) { return a.bytes > b.bytes; });
  return peak;
}

void Profile::exportMemoryTimeline(const std::string& path) {
  if (!opts_.memory)
    throw ValueError("Profile::exportMemoryTimeline: this profile did not record memory; start it with .memory = true");
  const std::vector<MemoryEvent>& mem = memoryEvents();
  const MemoryPeak peak = memoryPeak(DeviceType::CPU);
  const std::vector<Event>& ev = events();
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (const Event& e : ev) {
    t0 = std::min(t0, e.startNs);
    t1 = std::max(t1, e.endNs);
  }
  for (const MemoryEvent& m : mem) {
    t0 = std::min(t0, m.ns);
    t1 = std::max(t1, m.ns);
  }
  if (t0 >= t1) {
    t0 = 0;
    t1 = 1;
  }
  // One sample per pixel column: the largest total seen in it (so the peak is never averaged away).
  constexpr int kWidth = 1000, kHeight = 360, kLeft = 70, kTop = 20;
  std::vector<CategoryBytes> column(kWidth);
  std::vector<bool> seen(kWidth, false);
  CategoryBytes last = baseline_;
  auto colOf = [&](int64_t ns) {
    return std::clamp(static_cast<int>((static_cast<double>(ns - t0) / static_cast<double>(t1 - t0)) * (kWidth - 1)), 0,
                      kWidth - 1);
  };
  column[0] = baseline_;
  seen[0] = true;
  replay(mem, baseline_, DeviceType::CPU, [&](size_t i, const CategoryBytes& live) {
    int c = colOf(mem[i].ns);
    if (!seen[static_cast<size_t>(c)] || live.total() > column[static_cast<size_t>(c)].total())
      column[static_cast<size_t>(c)] = live;
    seen[static_cast<size_t>(c)] = true;
    last = live;
  });
  for (int c = 1; c < kWidth; ++c)
    if (!seen[static_cast<size_t>(c)]) column[static_cast<size_t>(c)] = column[static_cast<size_t>(c - 1)];
  const double ymax = static_cast<double>(std::max<int64_t>(peak.bytes, 1)) * 1.08;
  auto y = [&](int64_t bytes) { return kTop + kHeight - static_cast<double>(bytes) / ymax * kHeight; };

  std::string html;
  html += "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>cohort memory timeline</title>\n";
  html += "<style>body{font-family:sans-serif;margin:20px} table{border-collapse:collapse} "
          "td,th{padding:2px 10px;text-align:right} th{border-bottom:1px solid #888} td.l,th.l{text-align:left}</style>"
          "</head><body>\n";
  html += fmt::format("<h2>Live CPU memory by category</h2>\n<p>{:.1f} ms profiled, {} allocations and frees; peak {} "
                      "at {:.3f} ms.</p>\n",
                      static_cast<double>(t1 - t0) / 1e6, mem.size(), detail::formatBytes(peak.bytes),
                      static_cast<double>(peak.ns - t0) / 1e6);
  html += fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n", kLeft + kWidth + 20,
                      kTop + kHeight + 40);
  // Stacked areas, the first category at the bottom.
  for (int cat = kNumMemoryCategories - 1; cat >= 0; --cat) {
    std::string points;
    for (int c = 0; c < kWidth; ++c) {
      int64_t upto = 0;
      for (int k = 0; k <= cat; ++k) upto += column[static_cast<size_t>(c)].bytes[k];
      points += fmt::format("{},{:.1f} ", kLeft + c, y(upto));
    }
    points += fmt::format("{},{:.1f} {},{:.1f}", kLeft + kWidth - 1, y(0), kLeft, y(0));
    html += fmt::format("<polygon points=\"{}\" fill=\"{}\" stroke=\"none\"><title>{}</title></polygon>\n", points,
                        kColors[cat], memoryCategoryName(static_cast<MemoryCategory>(cat)));
  }
  for (int64_t b : stepBounds_)
    if (b >= t0 && b <= t1)
      html +=
          fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#999\" stroke-dasharray=\"3,3\"/>\n",
                      kLeft + colOf(b), kTop, kTop + kHeight);
  html += fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"black\"/><text x=\"{3}\" y=\"{4}\" "
                      "font-size=\"12\">peak {5}</text>\n",
                      kLeft + colOf(peak.ns), kTop, kTop + kHeight, kLeft + colOf(peak.ns) + 4, kTop + 12,
                      detail::formatBytes(peak.bytes));
  // Axes.
  html += fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"black\"/>\n", kLeft, kTop,
                      kTop + kHeight);
  html += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"black\"/>\n", kLeft, kLeft + kWidth,
                      kTop + kHeight);
  for (int k = 0; k <= 4; ++k) {
    const int64_t b = static_cast<int64_t>(ymax * k / 4);
    html += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", kLeft - 4,
                        y(b) + 4, detail::formatBytes(b));
    html += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{:.1f} ms</text>\n",
                        kLeft + (kWidth - 1) * k / 4, kTop + kHeight + 16, static_cast<double>(t1 - t0) / 1e6 * k / 4);
  }
  html += "</svg>\n<p>";
  for (int cat = 0; cat < kNumMemoryCategories; ++cat)
    html += fmt::format("<span style=\"background:{};display:inline-block;width:12px;height:12px\"></span> {} &nbsp; ",
                        kColors[cat], memoryCategoryName(static_cast<MemoryCategory>(cat)));
  html += "(dashed lines: step boundaries)</p>\n";
  html += "<h3>At the peak, by category</h3>\n<table><tr><th class=\"l\">category</th><th>bytes</th></tr>\n";
  for (int cat = 0; cat < kNumMemoryCategories; ++cat)
    html += fmt::format("<tr><td class=\"l\">{}</td><td>{}</td></tr>\n",
                        memoryCategoryName(static_cast<MemoryCategory>(cat)),
                        detail::formatBytes(peak.byCategory.bytes[cat]));
  html +=
      "</table>\n<h3>What held the peak</h3>\n<table><tr><th class=\"l\">allocated by</th><th class=\"l\">category</th>"
      "<th>bytes</th><th>blocks</th></tr>\n";
  size_t rows = 0;
  for (const MemoryPeak::Holder& h : peak.holders) {
    if (++rows > 25) break;
    const std::string op = htmlEscaped(h.op.empty() ? "(live before profiling)" : h.op);  // user range names
    html += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n", op,
                        memoryCategoryName(h.category), detail::formatBytes(h.bytes),
                        h.blocks > 0 ? std::to_string(h.blocks) : "");
  }
  html += "</table>\n</body></html>\n";
  detail::writeTextFile(path, html, "Profile::exportMemoryTimeline");
}

}  // namespace cohort::profiler
