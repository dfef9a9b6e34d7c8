#include <cohort/distributed/env/nodelist.h>

#include <cctype>
#include <cstdint>
#include <variant>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::dist::env {
namespace {

struct Range {
  uint64_t lo, hi;
  size_t width;  // digits of the lower bound: the zero padding every value keeps
};
// One host pattern: literal text and bracket groups, in order.
using Segment = std::variant<std::string, std::vector<Range>>;
using Pattern = std::vector<Segment>;

[[noreturn]] void malformed(std::string_view list, const std::string& what, size_t pos) {
  throw ValueError(fmt::format("malformed Slurm node list \"{}\": {} at position {}", list, what, pos));
}

uint64_t parseBound(std::string_view list, std::string_view digits, size_t pos) {
  if (digits.empty()) malformed(list, "empty range bound", pos);
  if (digits.size() > 18) malformed(list, fmt::format("range bound '{}' is too long", digits), pos);
  uint64_t v = 0;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      malformed(list, fmt::format("range bound '{}' is not a number", digits), pos);
    }
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// Parses the inside of one bracket group, list[begin, end).
std::vector<Range> parseGroup(std::string_view list, size_t begin, size_t end) {
  std::vector<Range> ranges;
  size_t pos = begin;
  while (true) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos || comma > end) comma = end;
    std::string_view entry = list.substr(pos, comma - pos);
    if (entry.empty()) malformed(list, "empty entry inside '[...]'", pos);
    size_t dash = entry.find('-');
    Range r{};
    if (dash == std::string_view::npos) {
      r.lo = r.hi = parseBound(list, entry, pos);
      r.width = entry.size();
    } else {
      std::string_view lo = entry.substr(0, dash), hi = entry.substr(dash + 1);
      r.lo = parseBound(list, lo, pos);
      r.hi = parseBound(list, hi, pos + dash + 1);
      r.width = lo.size();
      if (r.hi < r.lo) malformed(list, fmt::format("range '{}' runs backwards", entry), pos);
    }
    ranges.push_back(r);
    if (comma == end) break;
    pos = comma + 1;
  }
  return ranges;
}

std::vector<Pattern> parse(std::string_view list) {
  // Surrounding whitespace is tolerated (values pasted from scontrol); inner whitespace is not.
  size_t first = list.find_first_not_of(" \t\n");
  if (first == std::string_view::npos) throw ValueError(fmt::format("Slurm node list \"{}\" is empty", list));
  size_t last = list.find_last_not_of(" \t\n");
  std::vector<Pattern> patterns;
  Pattern current;
  std::string literal;
  size_t itemStart = first;
  auto endItem = [&](size_t pos) {
    if (!literal.empty()) current.emplace_back(std::move(literal));
    literal.clear();
    if (current.empty()) malformed(list, "empty host name", itemStart);
    patterns.push_back(std::move(current));
    current.clear();
    itemStart = pos + 1;
  };
  for (size_t i = first; i <= last; ++i) {
    char c = list[i];
    if (c == ',') {
      endItem(i);
    } else if (c == '[') {
      size_t close = list.find(']', i + 1);
      if (close == std::string_view::npos || close > last) malformed(list, "'[' is never closed", i);
      size_t nested = list.find('[', i + 1);
      if (nested != std::string_view::npos && nested < close) malformed(list, "nested '['", nested);
      if (!literal.empty()) current.emplace_back(std::move(literal));
      literal.clear();
      current.emplace_back(parseGroup(list, i + 1, close));
      i = close;
    } else if (c == ']') {
      malformed(list, "']' without a matching '['", i);
    } else if (std::isspace(static_cast<unsigned char>(c)) || !std::isprint(static_cast<unsigned char>(c))) {
      malformed(list, "whitespace or control character inside a host name", i);
    } else {
      literal.push_back(c);
    }
  }
  endItem(last);
  return patterns;
}

size_t countHosts(std::string_view list, const std::vector<Pattern>& patterns) {
  size_t total = 0;
  for (const auto& p : patterns) {
    size_t n = 1;
    for (const auto& seg : p) {
      if (const auto* group = std::get_if<std::vector<Range>>(&seg)) {
        size_t g = 0;
        for (const auto& r : *group) {
          uint64_t span = r.hi - r.lo + 1;
          if (span > kMaxNodeListHosts) g = kMaxNodeListHosts + 1;
          else g += span;
          if (g > kMaxNodeListHosts) break;
        }
        if (g > kMaxNodeListHosts || n > kMaxNodeListHosts / g) {
          throw ValueError(
              fmt::format("Slurm node list \"{}\" expands to more than {} hosts", list, kMaxNodeListHosts));
        }
        n *= g;
      }
    }
    total += n;
    if (total > kMaxNodeListHosts) {
      throw ValueError(fmt::format("Slurm node list \"{}\" expands to more than {} hosts", list, kMaxNodeListHosts));
    }
  }
  return total;
}

void appendNumber(std::string& out, uint64_t v, size_t width) {
  std::string digits = std::to_string(v);
  if (digits.size() < width) out.append(width - digits.size(), '0');
  out += digits;
}

void expandPattern(const Pattern& p, size_t segIdx, std::string& prefix, std::vector<std::string>& out) {
  if (segIdx == p.size()) {
    out.push_back(prefix);
    return;
  }
  const size_t mark = prefix.size();
  if (const auto* lit = std::get_if<std::string>(&p[segIdx])) {
    prefix += *lit;
    expandPattern(p, segIdx + 1, prefix, out);
  } else {
    for (const auto& r : std::get<std::vector<Range>>(p[segIdx])) {
      for (uint64_t v = r.lo;; ++v) {
        prefix.resize(mark);
        appendNumber(prefix, v, r.width);
        expandPattern(p, segIdx + 1, prefix, out);
        if (v == r.hi) break;
      }
    }
  }
  prefix.resize(mark);
}

}  // namespace

std::vector<std::string> expandNodeList(std::string_view list) {
  auto patterns = parse(list);
  std::vector<std::string> out;
  out.reserve(countHosts(list, patterns));
  std::string prefix;
  for (const auto& p : patterns) expandPattern(p, 0, prefix, out);
  return out;
}

std::string firstNodeListHost(std::string_view list) {
  auto patterns = parse(list);
  countHosts(list, patterns);
  std::string host;
  for (const auto& seg : patterns.front()) {
    if (const auto* lit = std::get_if<std::string>(&seg)) host += *lit;
    else
      appendNumber(host, std::get<std::vector<Range>>(seg).front().lo, std::get<std::vector<Range>>(seg).front().width);
  }
  return host;
}

std::vector<int> expandTasksPerNode(std::string_view counts) {
  auto bad = [&](const std::string& what) -> ValueError {
    return ValueError(fmt::format("malformed Slurm task counts \"{}\" (expected e.g. \"2(x3),1\"): {}", counts, what));
  };
  auto number = [&](std::string_view s) -> int64_t {
    if (s.empty() || s.size() > 9) throw bad(fmt::format("'{}' is not a count", s));
    int64_t v = 0;
    for (char c : s) {
      if (!std::isdigit(static_cast<unsigned char>(c))) throw bad(fmt::format("'{}' is not a count", s));
      v = v * 10 + (c - '0');
    }
    return v;
  };
  std::vector<int> out;
  if (counts.empty()) throw bad("empty");
  size_t pos = 0;
  while (true) {
    size_t comma = counts.find(',', pos);
    std::string_view item = counts.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    size_t paren = item.find('(');
    int64_t tasks, repeat = 1;
    if (paren == std::string_view::npos) {
      tasks = number(item);
    } else {
      tasks = number(item.substr(0, paren));
      std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        throw bad(fmt::format("'{}' is not of the form N(xM)", item));
      }
      repeat = number(rest.substr(2, rest.size() - 3));
      if (repeat == 0) throw bad(fmt::format("'{}' repeats zero times", item));
    }
    if (out.size() + static_cast<size_t>(repeat) > kMaxNodeListHosts) throw bad("too many nodes");
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(tasks));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace cohort::dist::env
