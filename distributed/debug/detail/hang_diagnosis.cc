#include <cohort/distributed/debug/detail/hang_diagnosis.h>

#include <chrono>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cohort/core/util/error.h>
#include <cohort/distributed/debug/detail/progress_publisher.h>
#include <cohort/distributed/debug/flight_recorder.h>
#include <cohort/distributed/detail/op_args.h>

namespace cohort::dist {

HangDiagnoser::HangDiagnoser(StorePtr store, int rank, int size, std::vector<int> globalRanks,
                             std::shared_ptr<ProgressPublisher> progress)
    : store_(std::move(store)), rank_(rank), size_(size), globalRanks_(std::move(globalRanks)),
      progress_(std::move(progress)) {}

std::string HangDiagnoser::diagnose(uint64_t seq) const {
  if (seq == 0) return "";  // send/recv: the label names the peer
  // Only failing ops are diagnosed: say so first, so the other ranks' diagnoses can tell this
  // rank (alive, failed) from the one that died or stalled.
  progress_->markFailed(seq);
  progress_->publish();
  // Peers publish asynchronously: give them a moment so only ranks that really went silent (or
  // never came) are named. Stops early once every other rank is accounted for.
  const auto graceEnd = std::chrono::steady_clock::now() + Millis(500);
  std::vector<int> notReached, silent, failed;
  std::map<int, RankProgress> seen;
  while (true) {
    notReached.clear();
    silent.clear();
    failed.clear();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      RankProgress p = readProgress(*store_, r);
      seen[r] = p;
      if (p.started < seq) notReached.push_back(r);
      else if (p.failed >= seq) failed.push_back(r);
      else if (p.completed < seq) silent.push_back(r);
    }
    if ((notReached.empty() && silent.empty()) || std::chrono::steady_clock::now() >= graceEnd) break;
    std::this_thread::sleep_for(Millis(50));
  }
  auto rankName = [&](int r) { return op_args::rankName(r, globalRanks_); };
  auto names = [&](const std::vector<int>& rs) {
    std::vector<std::string> out;
    for (int r : rs) out.push_back(rankName(r));
    return fmt::format("{}", fmt::join(out, ", "));
  };
  std::string msg;
  if (!notReached.empty()) {
    std::vector<std::string> last;
    for (int r : notReached) last.push_back(fmt::format("rank {} at #{}", rankName(r), seen[r].started));
    msg = fmt::format("ranks that never reached it: [{}] (last op they started: {})", names(notReached),
                      fmt::join(last, ", "));
  } else if (!silent.empty()) {
    msg = fmt::format("every rank reached it; ranks that started it but neither finished nor reported an error "
                      "(dead or stalled): [{}]",
                      names(silent));
  } else {
    msg = "every rank reached it";
  }
  if (!failed.empty()) msg += fmt::format("; ranks that failed it too: [{}]", names(failed));
  return msg;
}

GroupWorkObserver::GroupWorkObserver(std::weak_ptr<const HangDiagnoser> diagnoser,
                                     std::shared_ptr<ProgressPublisher> progress,
                                     std::shared_ptr<FlightRecorder> recorder)
    : diagnoser_(std::move(diagnoser)), progress_(std::move(progress)), recorder_(std::move(recorder)) {}

void GroupWorkObserver::onComplete(const Work& work, uint64_t entry, const std::exception_ptr& error) {
  const uint64_t seq = work.sequenceNumber();
  if (!error) {
    recorder_->complete(entry, FlightRecorder::State::Completed);
    if (seq) progress_->markCompleted(seq);
    return;
  }
  std::string what;
  bool distError = false;
  try {
    std::rethrow_exception(error);
  } catch (const DistError& e) {
    what = e.what();
    distError = true;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown error";
  }
  recorder_->complete(entry, FlightRecorder::State::Failed, what);
  if (seq) progress_->markFailed(seq);
  if (distError) dumpFlightRecorders(what);  // a dead peer or a timeout: keep the evidence
}

std::string GroupWorkObserver::diagnose(const Work& work) const {
  auto diagnoser = diagnoser_.lock();
  return diagnoser ? diagnoser->diagnose(work.sequenceNumber()) : std::string();
}

}  // namespace cohort::dist
