#include <cohort/core/util/env.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>

#include <cohort/core/util/check.h>

namespace cohort::env {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, KnobInfo> knobs;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: knobs may be read during static teardown
  return *r;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

Knob::Knob(const char* name, const char* defaultValue, const char* description) : name_(name), default_(defaultValue) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.knobs[name] = KnobInfo{name, defaultValue, description};
}

std::optional<std::string> Knob::raw() const {
  const char* v = std::getenv(name_);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string Knob::str() const { return raw().value_or(default_); }

int64_t Knob::integer() const {
  std::string s = str();
  try {
    size_t pos = 0;
    int64_t v = std::stoll(s, &pos);
    if (pos == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw ValueError(fmt::format("environment variable {}='{}' is not an integer", name_, s));
}

double Knob::number() const {
  std::string s = str();
  try {
    size_t pos = 0;
    double v = std::stod(s, &pos);
    if (pos == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw ValueError(fmt::format("environment variable {}='{}' is not a number", name_, s));
}

bool Knob::flag() const {
  std::string s = lower(str());
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  throw ValueError(
      fmt::format("environment variable {}='{}' is not a boolean (use 1/0, true/false, yes/no, on/off)", name_, s));
}

std::vector<KnobInfo> allKnobs() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<KnobInfo> out;
  for (auto& [k, v] : r.knobs) out.push_back(v);
  return out;
}

}  // namespace cohort::env
