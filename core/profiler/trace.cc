// Chrome trace event export of a Profile, and the merge of several ranks' traces into one.
//
// Format: {"traceEvents": [...], "displayTimeUnit": "ms", "cohort": {...}}. Spans are complete
// events ("ph": "X") with ts/dur in microseconds; processes are ranks, threads are the threads that
// recorded (and named tracks such as "pg world"); flows ("s"/"f") carry numeric ids, a 53-bit hash
// of a string naming the flow, so the two ends agree across ranks without coordination. Memory
// events are PyTorch's "[memory]" instant events, plus a counter track of live bytes by category.
//
// What Perfetto's JSON importer (ui.perfetto.dev) needs, beyond valid JSON: tids other than 0 (it
// files tid 0 under tid == pid, another thread's track); complete events of one tid that nest or
// are disjoint (one that partly overlaps another is set aside as an error, or dropped by older
// versions), so a named track's concurrent spans go to lanes of their own; a flow's start read
// before its end (it sorts by ts and drops an end whose start it has not seen), each (id, cat,
// name) started once, both ends on spans that start at the flow's ts; strings without raw control
// characters (DEL included) and valid UTF-8 (which the merge's JSON parser needs too).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include <cohort/core/profiler/detail/session.h>
#include <cohort/core/util/check.h>

namespace cohort::profiler {

namespace detail {

namespace {
// Bytes in the valid UTF-8 sequence that starts s[i] (overlong forms, surrogates and code points
// past U+10FFFF are not valid), or 0.
size_t utf8Length(std::string_view s, size_t i) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  const size_t n = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && at(i + 1) < 0xa0) || (c == 0xed && at(i + 1) >= 0xa0) || (c == 0xf0 && at(i + 1) < 0x90) ||
      (c == 0xf4 && at(i + 1) >= 0x90))
    return 0;
  return n;
}
}  // namespace

void appendJsonEscaped(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
          out += fmt::format("\\u{:04x}", static_cast<int>(u));
        } else if (u < 0x80) {
          out += c;
        } else if (size_t n = utf8Length(s, i); n > 0) {
          out.append(s.substr(i, n));
          i += n - 1;
        } else {
          out += "\xef\xbf\xbd";  // U+FFFD for a byte that is not UTF-8
        }
      }
    }
  }
}

}  // namespace detail

namespace {

const char* category(EventKind k) {
  switch (k) {
    case EventKind::Op:
    case EventKind::Backward: return "cpu_op";
    case EventKind::Range:
    case EventKind::Step: return "user_annotation";
    case EventKind::Collective: return "collective";
    case EventKind::Wait: return "wait";
    case EventKind::Rpc: return "rpc";
    case EventKind::Ddp: return "ddp";
    case EventKind::Fsdp: return "fsdp";
  }
  return "other";
}

// FNV-1a, kept to 53 bits so JSON readers that parse numbers as doubles keep it exact.
uint64_t flowId(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h & ((uint64_t{1} << 53) - 1);
}

// Appends to a fmt::memory_buffer (fmt's fastest output); timestamps are printed as integers.
struct Writer {
  fmt::memory_buffer out;
  bool first = true;
  void begin() {
    if (!first) raw(",\n");
    first = false;
  }
  void raw(std::string_view s) { out.append(s.data(), s.data() + s.size()); }
  void str(std::string_view s) {
    out.push_back('"');
    bool plain = true;
    for (char c : s)
      plain = plain && c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20 &&
              static_cast<unsigned char>(c) < 0x7f;
    if (plain) {
      raw(s);
    } else {
      std::string escaped;
      detail::appendJsonEscaped(escaped, s);
      raw(escaped);
    }
    out.push_back('"');
  }
  // Microseconds with three decimals, from nanoseconds, without floating point.
  void ts(int64_t ns) {
    if (ns < 0) {
      out.push_back('-');
      ns = -ns;
    }
    fmt::format_to(std::back_inserter(out), "{}.{:03}", ns / 1000, ns % 1000);
  }
};

// "[float32, Scalar]" as a JSON array of strings.
void dtypesArray(Writer& w, const std::string& dtypes) {
  w.out.push_back('[');
  std::string_view s = dtypes;
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  bool first = true;
  while (!s.empty()) {
    size_t comma = s.find(", ");
    std::string_view item = s.substr(0, comma);
    if (!first) w.raw(", ");
    first = false;
    w.str(item);
    if (comma == std::string_view::npos) break;
    s = s.substr(comma + 2);
  }
  w.out.push_back(']');
}

void flowEvent(Writer& w, int rank, uint32_t tid, int64_t ns, const std::string& id, bool start, const char* cat) {
  w.begin();
  fmt::format_to(std::back_inserter(w.out),
                 R"({{"ph": "{}", "cat": "{}", "name": "{}", "id": {}, "pid": {}, "tid": {}, "ts": )",
                 start ? "s" : "f", cat, cat, flowId(id), rank, tid);
  w.ts(ns);
  if (!start) w.raw(R"(, "bp": "e")");
  w.out.push_back('}');
}

// The trace's tracks: each thread (or named track) is a tid, from 1 up; a named track whose spans
// overlap (a group's collectives in flight together, concurrent RPCs) is spread over lanes, each a
// tid after the threads', in which no two spans overlap. A thread's spans nest by construction, so
// there a lane also takes a span that lies within its innermost open one (a second lane is needed
// only where a span's end was raised to make it 1 ns long, past its parent's).
struct Tracks {
  std::vector<uint32_t> tidOf;  // per event
  struct Lane {
    uint32_t thread = 0;
    uint32_t index = 0;  // 0: the thread's own tid (thread + 1)
    uint32_t tid = 0;
  };
  std::vector<Lane> lanes;  // every thread's lane 0 first, in thread order, then the extra lanes

  Tracks(const std::vector<Event>& ev, const std::vector<ThreadInfo>& threads) : tidOf(ev.size()) {
    std::vector<std::vector<uint32_t>> byThread(threads.size());
    for (uint32_t i = 0; i < ev.size(); ++i) byThread[ev[i].thread].push_back(i);
    for (uint32_t t = 0; t < threads.size(); ++t) lanes.push_back({t, 0, t + 1});
    auto before = [&](uint32_t a, uint32_t b) {
      return ev[a].startNs != ev[b].startNs ? ev[a].startNs < ev[b].startNs : ev[a].endNs > ev[b].endNs;
    };
    for (uint32_t t = 0; t < threads.size(); ++t) {
      std::vector<uint32_t>& idx = byThread[t];
      if (!std::is_sorted(idx.begin(), idx.end(), before)) std::stable_sort(idx.begin(), idx.end(), before);
      const bool nest = threads[t].osTid > 0;
      std::vector<std::vector<int64_t>> open;  // per lane, the ends of its open spans, innermost last
      std::vector<uint32_t> laneTids;
      for (uint32_t i : idx) {
        const Event& e = ev[i];
        size_t lane = 0;
        for (; lane < open.size(); ++lane) {
          std::vector<int64_t>& ends = open[lane];
          while (!ends.empty() && ends.back() <= e.startNs) ends.pop_back();
          if (ends.empty() || (nest && ends.back() >= e.endNs)) break;
        }
        if (lane == open.size()) {
          open.emplace_back();
          const uint32_t tid = lane == 0 ? t + 1 : static_cast<uint32_t>(lanes.size()) + 1;
          if (lane > 0) lanes.push_back({t, static_cast<uint32_t>(lane), tid});
          laneTids.push_back(tid);
        }
        open[lane].push_back(e.endNs);
        tidOf[i] = laneTids[lane];
      }
    }
  }
};

}  // namespace

std::string Profile::chromeTrace(int64_t clockOffsetNs, TraceStats* stats) {
  const std::vector<Event>& ev = events();
  const int rank = opts_.rank;
  Writer w;
  w.out.reserve(ev.size() * 200 + memory_.size() * 420 + 4096);
  w.raw("{\"traceEvents\": [\n");
  w.begin();
  fmt::format_to(std::back_inserter(w.out),
                 R"({{"ph": "M", "name": "process_name", "pid": {}, "tid": 0, "args": {{"name": "rank {}"}}}})", rank,
                 rank);
  w.begin();
  fmt::format_to(std::back_inserter(w.out),
                 R"({{"ph": "M", "name": "process_sort_index", "pid": {}, "tid": 0, "args": {{"sort_index": {}}}}})",
                 rank, rank);
  const Tracks tracks(ev, threads_);
  // Threads in the order they first recorded, then the named tracks, each followed by its lanes.
  std::vector<const Tracks::Lane*> order;
  for (const Tracks::Lane& l : tracks.lanes) order.push_back(&l);
  std::stable_sort(order.begin(), order.end(), [&](const Tracks::Lane* a, const Tracks::Lane* b) {
    return std::pair(threads_[a->thread].osTid == 0, a->thread) < std::pair(threads_[b->thread].osTid == 0, b->thread);
  });
  for (size_t k = 0; k < order.size(); ++k) {
    const Tracks::Lane& l = *order[k];
    const ThreadInfo& th = threads_[l.thread];
    std::string name = th.osTid > 0 ? fmt::format("{} ({})", th.name, th.osTid) : th.name;
    if (l.index > 0) name += fmt::format(" #{}", l.index + 1);
    w.begin();
    fmt::format_to(std::back_inserter(w.out),
                   R"({{"ph": "M", "name": "thread_name", "pid": {}, "tid": {}, "args": {{"name": )", rank, l.tid);
    w.str(name);
    w.raw("}}");
    w.begin();
    fmt::format_to(std::back_inserter(w.out),
                   R"({{"ph": "M", "name": "thread_sort_index", "pid": {}, "tid": {}, "args": {{"sort_index": {}}}}})",
                   rank, l.tid, k);
  }
  // Forward ops by sequence number, to draw forward -> backward flows.
  std::unordered_map<uint64_t, size_t> forwardBySeq;
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind == EventKind::Op && ev[i].seq != 0) forwardBySeq.emplace(ev[i].seq, i);
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    const int64_t start = e.startNs - clockOffsetNs;
    w.begin();
    fmt::format_to(std::back_inserter(w.out), R"({{"ph": "X", "cat": "{}", "name": )", category(e.kind));
    w.str(e.name);
    fmt::format_to(std::back_inserter(w.out), R"(, "pid": {}, "tid": {}, "ts": )", rank, tracks.tidOf[i]);
    w.ts(start);
    w.raw(", \"dur\": ");
    w.ts(e.durationNs());
    w.raw(", \"args\": {");
    bool firstArg = true;
    auto arg = [&](std::string_view key) {
      if (!firstArg) w.raw(", ");
      firstArg = false;
      w.str(key);
      w.raw(": ");
    };
    if (!e.shapes.empty()) {
      arg("Input Dims");
      w.raw(e.shapes);
      arg("Input type");
      dtypesArray(w, e.dtypes);
    }
    if (e.seq != 0 && (e.kind == EventKind::Op || e.kind == EventKind::Backward)) {
      arg("Sequence number");
      fmt::format_to(std::back_inserter(w.out), "{}", e.seq);
    }
    if (opts_.memory && (e.allocBytes != 0 || e.freedBytes != 0 || e.totalAllocBytes != 0)) {
      arg("Self Alloc Bytes");
      fmt::format_to(std::back_inserter(w.out), "{}", e.allocBytes);
      arg("Self Freed Bytes");
      fmt::format_to(std::back_inserter(w.out), "{}", e.freedBytes);
      arg("Total Alloc Bytes");
      fmt::format_to(std::back_inserter(w.out), "{}", e.totalAllocBytes);
    }
    for (const Arg& a : e.args) {
      arg(a.key);
      if (a.isNumber) fmt::format_to(std::back_inserter(w.out), "{}", a.number);
      else w.str(a.text);
    }
    w.raw("}}");
    for (const Flow& f : e.flows) flowEvent(w, rank, tracks.tidOf[i], start, f.id, f.start, category(e.kind));
    if (e.kind == EventKind::Backward && e.seq != 0) {
      auto it = forwardBySeq.find(e.seq);
      if (it != forwardBySeq.end()) {
        // One flow per backward span: a node run twice (retain_graph) must not start one id twice.
        const Event& fwd = ev[it->second];
        const std::string id = fmt::format("fwdbwd/{}/{}/{}", rank, e.seq, i);
        flowEvent(w, rank, tracks.tidOf[it->second], fwd.startNs - clockOffsetNs, id, true, "fwdbwd");
        flowEvent(w, rank, tracks.tidOf[i], start, id, false, "fwdbwd");
      }
    }
  }
  // Memory: PyTorch's instant events, and a counter of live CPU bytes by category.
  CategoryBytes live = baseline_;
  for (const MemoryEvent& m : memory_) {
    const bool cpu = m.device.type() == DeviceType::CPU;
    if (cpu) detail::applyMemoryEvent(live, m);
    const int64_t ts = m.ns - clockOffsetNs;
    if (m.kind != MemoryEventKind::Retag) {
      w.begin();
      fmt::format_to(
          std::back_inserter(w.out),
          R"({{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": {}, "tid": {}, "ts": )",
          rank, m.thread + 1);
      w.ts(ts);
      fmt::format_to(
          std::back_inserter(w.out),
          R"(, "args": {{"Device Type": {}, "Device Id": {}, "Addr": {}, "Bytes": {}, "Total Allocated": {}, )"
          R"("Total Reserved": {}, "Category": "{}", "Op": )",
          static_cast<int>(m.device.type()), cpu ? -1 : m.device.index(), m.addr,
          m.kind == MemoryEventKind::Alloc ? m.bytes : -m.bytes, cpu ? live.total() : m.allocatorBytes,
          std::max(m.reservedBytes, cpu ? live.total() : m.allocatorBytes), memoryCategoryName(m.category));
      w.str(m.op);
      if (!m.stack.empty()) {
        w.raw(", \"Stack\": ");
        w.str(m.stack);
      }
      w.raw("}}");
    }
    if (cpu) {
      w.begin();
      fmt::format_to(std::back_inserter(w.out), R"({{"ph": "C", "name": "CPU memory by category", "pid": {}, "ts": )",
                     rank);
      w.ts(ts);
      w.raw(", \"args\": {");
      for (int c = 0; c < kNumMemoryCategories; ++c)
        fmt::format_to(std::back_inserter(w.out), R"({}"{}": {})", c == 0 ? "" : ", ",
                       memoryCategoryName(static_cast<MemoryCategory>(c)), live.bytes[c]);
      w.raw("}}");
    }
  }
  const int64_t steps = static_cast<int64_t>(stepBounds_.size());
  fmt::format_to(std::back_inserter(w.out),
                 "\n], \"displayTimeUnit\": \"ms\", \"cohort\": {{\"version\": 1, \"rank\": {}, \"clockOffsetNs\": {}, "
                 "\"steps\": {}, \"events\": {}, \"memoryEvents\": {}}}}}\n",
                 rank, clockOffsetNs, steps, ev.size(), memory_.size());
  if (stats != nullptr) {
    stats->bytes = static_cast<int64_t>(w.out.size());
    stats->events = static_cast<int64_t>(ev.size() + memory_.size());
    stats->steps = steps;
    stats->bytesPerStep = stats->bytes / std::max<int64_t>(steps, 1);
  }
  return fmt::to_string(w.out);
}

namespace detail {
void writeTextFile(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (f) f.close();
  if (!f) throw Error(fmt::format("{}: cannot write '{}': {}", what, path, std::strerror(errno)));
}
}  // namespace detail

TraceStats Profile::exportChromeTrace(const std::string& path) {
  TraceStats stats;
  std::string text = chromeTrace(0, &stats);
  detail::writeTextFile(path, text, "Profile::exportChromeTrace");
  return stats;
}

// ---- Merging ranks ----

std::string mergeTraces(const std::vector<std::string>& rankTraces) {
  using nlohmann::json;
  if (rankTraces.empty()) throw ValueError("mergeTraces: no traces to merge");
  json merged = json::object();
  json& out = merged["traceEvents"] = json::array();
  // (group, seq) -> the collective's event on each rank (index into out).
  std::map<std::pair<std::string, int64_t>, std::vector<size_t>> collectives;
  std::vector<int> ranks;
  for (size_t i = 0; i < rankTraces.size(); ++i) {
    json t = json::parse(rankTraces[i], nullptr, false);
    if (t.is_discarded() || !t.is_object() || !t.contains("traceEvents") || !t["traceEvents"].is_array() ||
        !t.contains("cohort"))
      throw ValueError(fmt::format("mergeTraces: input {} is not a cohort Chrome trace (JSON object with traceEvents "
                                   "and cohort metadata)",
                                   i));
    int rank = t["cohort"].value("rank", -1);
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
      throw ValueError(fmt::format("mergeTraces: rank {} appears twice (input {})", rank, i));
    ranks.push_back(rank);
    for (json& e : t["traceEvents"]) {
      if (e.value("ph", "") == "X" && e.value("cat", "") == "collective" && e.contains("args")) {
        const json& a = e["args"];
        if (a.contains("group") && a.contains("seq") && a["seq"].get<int64_t>() > 0)
          collectives[{a["group"].get<std::string>(), a["seq"].get<int64_t>()}].push_back(out.size());
      }
      out.push_back(std::move(e));
    }
  }
  // Each collective: how long each rank waited for the last one to arrive, how long it then took,
  // and flows from the event of the rank that arrived first to every other rank's (a flow must not
  // end before it starts: Perfetto's JSON importer reads events in ts order and drops such an end).
  int64_t matched = 0;
  for (auto& [key, idx] : collectives) {
    if (idx.size() < 2) continue;
    ++matched;
    double lastStart = 0;
    for (size_t k : idx) lastStart = std::max(lastStart, out[k]["ts"].get<double>());
    for (size_t k : idx) {
      json& e = out[k];
      double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
      e["args"]["wait_us"] = std::round((lastStart - ts) * 1e3) / 1e3;
      e["args"]["move_us"] = std::round(std::max(0.0, ts + dur - lastStart) * 1e3) / 1e3;
    }
    size_t src = 0;
    for (size_t j = 1; j < idx.size(); ++j)
      if (out[idx[j]]["ts"].get<double>() < out[idx[src]]["ts"].get<double>()) src = j;
    // Copies: push_back may move the events these come from.
    const json from = {{"pid", out[idx[src]]["pid"]}, {"tid", out[idx[src]]["tid"]}, {"ts", out[idx[src]]["ts"]}};
    for (size_t j = 0; j < idx.size(); ++j) {
      if (j == src) continue;
      const json to = {{"pid", out[idx[j]]["pid"]}, {"tid", out[idx[j]]["tid"]}, {"ts", out[idx[j]]["ts"]}};
      const uint64_t id = flowId(fmt::format("coll/{}/{}/{}", key.first, key.second, j));
      out.push_back({{"ph", "s"},
                     {"cat", "collective"},
                     {"name", "collective"},
                     {"id", id},
                     {"pid", from["pid"]},
                     {"tid", from["tid"]},
                     {"ts", from["ts"]}});
      out.push_back({{"ph", "f"},
                     {"bp", "e"},
                     {"cat", "collective"},
                     {"name", "collective"},
                     {"id", id},
                     {"pid", to["pid"]},
                     {"tid", to["tid"]},
                     {"ts", to["ts"]}});
    }
  }
  std::sort(ranks.begin(), ranks.end());
  merged["displayTimeUnit"] = "ms";
  merged["cohort"] = {{"version", 1}, {"merged", true}, {"ranks", ranks}, {"matchedCollectives", matched}};
  // nlohmann writes DEL raw, which older versions of Perfetto's JSON importer reject in a string (a
  // 0x7f byte is never part of a UTF-8 sequence nor JSON's syntax, so only strings hold it).
  std::string text = merged.dump();
  for (size_t p = text.find('\x7f'); p != std::string::npos; p = text.find('\x7f', p)) text.replace(p, 1, "\\u007f");
  return text;
}

}  // namespace cohort::profiler
