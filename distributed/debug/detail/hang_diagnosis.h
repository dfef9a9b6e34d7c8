/*
 * Internal to ProcessGroup: what a group's Works report when they complete, and the explanation
 * a failed collective's error carries of which ranks never reached it or never finished it.
 *
 * GroupWorkObserver is the Work::Observer a group installs on every Work it starts (one per group,
 * shared). Its onComplete(), on the completing thread, closes the op's flight-recorder entry
 * (completed, or failed with the error's message) and advances this rank's published progress
 * (progress_publisher.h); a DistError (a dead peer, a timeout) also dumps every flight recorder of
 * the process (dumpFlightRecorders), to keep the evidence. Its diagnose() is what Work's
 * timeoutError/peerError/distError append to their message; it asks the group's HangDiagnoser.
 *
 * HangDiagnoser::diagnose(seq) works from the progress every rank publishes. It first marks `seq`
 * failed in this rank's progress and publishes it at once, so that the other ranks' diagnoses can
 * tell this rank (alive, failed) from one that died or stalled. Then it reads the other ranks'
 * progress, again every 50 ms for up to 500 ms (peers publish from a background thread, at most
 * 200 ms late), stopping early once none is missing, and says one of:
 *   "ranks that never reached it: [2, 3] (last op they started: rank 2 at #6, rank 3 at #6)"
 *   "every rank reached it; ranks that started it but neither finished nor reported an error
 *    (dead or stalled): [2]"
 *   "every rank reached it"
 * followed by "; ranks that failed it too: [1]" when some did. Ranks are named by group rank, with
 * the world rank in a subgroup ("1 (global rank 3)"). Send/recv get no diagnosis ("": their label
 * names the peer). A store that cannot be read throws (Work reports that instead).
 *
 * Lifetime: the group owns its HangDiagnoser and the observer holds it weakly, so Works that fail
 * while the group is being destroyed (its backends failing what was pending) get no diagnosis and
 * no wait. diagnose() may run on any thread, several at once.
 */
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <cohort/distributed/store/store.h>
#include <cohort/distributed/work.h>

namespace cohort::dist {

class FlightRecorder;
class ProgressPublisher;

class HangDiagnoser {
 public:
  // `store` is the group's, `rank` of `size` this rank, `globalRanks` the members as world ranks
  // and `progress` this rank's publisher.
  HangDiagnoser(StorePtr store, int rank, int size, std::vector<int> globalRanks,
                std::shared_ptr<ProgressPublisher> progress);

  // Who never reached or never finished collective `seq` (see above); "" for send/recv (seq 0).
  std::string diagnose(uint64_t seq) const;

 private:
  StorePtr store_;
  int rank_;
  int size_;
  std::vector<int> globalRanks_;
  std::shared_ptr<ProgressPublisher> progress_;
};

class GroupWorkObserver final : public Work::Observer {
 public:
  GroupWorkObserver(std::weak_ptr<const HangDiagnoser> diagnoser, std::shared_ptr<ProgressPublisher> progress,
                    std::shared_ptr<FlightRecorder> recorder);

  // `entry` is the op's flight-recorder entry.
  void onComplete(const Work& work, uint64_t entry, const std::exception_ptr& error) override;
  std::string diagnose(const Work& work) const override;

 private:
  std::weak_ptr<const HangDiagnoser> diagnoser_;
  std::shared_ptr<ProgressPublisher> progress_;
  std::shared_ptr<FlightRecorder> recorder_;
};

}  // namespace cohort::dist
