// Progress lines for the example programs: one line per log interval with step, loss,
// throughput, elapsed time and ETA, e.g.
//   step   120/600 | epoch 3 | loss 0.4312 | 9,850 samples/s | elapsed 0:01 | eta 0:05
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace examples {

inline std::string clock(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

class Progress {
 public:
  Progress(int64_t totalSteps, std::string unit) : total_(totalSteps), unit_(std::move(unit)) {}

  // Counts `items` processed (samples or tokens) since the last call.
  void add(int64_t items) { items_ += items; }

  // Prints the line; returns the throughput it printed (items per second since the last line).
  double log(int64_t step, double loss, const std::string& extra = "") {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - start_).count();
    double window = std::chrono::duration<double>(now - last_).count();
    double rate = window > 0 ? static_cast<double>(items_) / window : 0.0;
    double perStep = step > startStep_ ? elapsed / static_cast<double>(step - startStep_) : 0.0;
    double eta = perStep * static_cast<double>(total_ - step);
    fmt::print("step {:>{}}/{}{} | loss {:.4f} | {:.0f} {}/s | elapsed {} | eta {}\n", step,
               fmt::formatted_size("{}", total_), total_, extra.empty() ? "" : " | " + extra, loss, rate, unit_,
               clock(elapsed), clock(eta));
    std::fflush(stdout);
    items_ = 0;
    last_ = now;
    return rate;
  }
  // Resumed runs measure the ETA from where they started.
  void setStartStep(int64_t s) { startStep_ = s; }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  int64_t total_;
  std::string unit_;
  int64_t items_ = 0;
  int64_t startStep_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

}  // namespace examples
