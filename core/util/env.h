/*
 * The one registry of environment knobs. Every variable the runtime reads is declared once with
 * a name, a default and a description (COHORT_ENV_KNOB at namespace scope in the .cc that uses
 * it), read through that declaration, and listed by allKnobs() so `cohortrun --help-env` can
 * print every one. Every read calls getenv, so a value set by the program (or a test) before the
 * read is seen; read knobs once where a hot path needs them (at construction, as backends do).
 * Reading is safe from any thread as long as nothing calls setenv concurrently (POSIX).
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::env {

struct KnobInfo {
  std::string name;
  std::string defaultValue;
  std::string description;
};

class Knob {
 public:
  Knob(const char* name, const char* defaultValue, const char* description);
  const char* name() const { return name_; }
  // The raw value, or nullopt when the variable is unset (or empty).
  std::optional<std::string> raw() const;
  std::string str() const;  // value or default
  int64_t integer() const;  // throws ValueError naming the variable when it is not an integer
  double number() const;
  bool flag() const;  // 1/true/yes/on vs 0/false/no/off (case-insensitive); else ValueError

 private:
  const char* name_;
  const char* default_;
};

// Every knob declared in this process so far, sorted by name.
std::vector<KnobInfo> allKnobs();

}  // namespace cohort::env

// Declares a knob at namespace scope: `COHORT_ENV_KNOB(kLogLevel, "COHORT_LOG_LEVEL", "info", "...")`.
#define COHORT_ENV_KNOB(var, name, def, desc) \
  static const ::cohort::env::Knob var { name, def, desc }
