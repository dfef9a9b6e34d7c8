/*
 * Pipeline schedules as data. A model is cut into `stages` consecutive (virtual) stages, placed
 * on `ranks` pipeline ranks (stage s on rank placement[s]); a batch is cut into `microbatches`.
 * A schedule is, for every rank, the list of actions it runs in order:
 *
 *   F  forward of micro-batch i on stage s
 *   B  full backward (input and weight gradients)
 *   I  backward for the input only (the gradient the previous stage waits for)
 *   W  backward for the weights (postponed; zero-bubble schedules fill idle time with it)
 *   SF / RF  send / receive stage s's activation (SF(s, i) sends to stage s + 1; RF(s, i)
 *            receives stage s's input from stage s - 1)
 *   SB / RB  send / receive a gradient (SB(s, i) sends stage s's input gradient to stage s - 1;
 *            RB(s, i) receives stage s's output gradient from stage s + 1)
 *
 * Built-in schedules produce compute actions only; withCommunication() inserts each send right
 * after the action that produced the tensor and each receive right before the action that needs
 * it (stages on one rank hand tensors over in memory, without actions). A hand-written schedule
 * may give its own sends and receives; it is then checked as written.
 *
 * simulate() runs a schedule on a model of the machine: every rank executes its list in order; a
 * compute action starts when its rank is free and its inputs are there; a send costs its rank
 * `send` and arrives `latency` later; a receive waits for the matching send. It returns each
 * action's start and end, the bubble fraction (idle share of ranks x step time) and the peak of
 * live activations per rank (a micro-batch's activations are live from its forward until its
 * backward, or its weight backward when the backward is split). The same run is the checker:
 * check() refuses, with a ScheduleError naming the first action that cannot proceed, a schedule
 * that is incomplete (a missing or duplicated action, an action on the wrong rank, a send with no
 * receive) or that deadlocks (every unfinished rank waits, for an action that comes later on its
 * own rank or on a rank that waits in turn).
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cohort/core/util/error.h>

namespace cohort::pipeline {

class ScheduleError : public ValueError {
  using ValueError::ValueError;
};

enum class ActionKind : uint8_t {
  Forward,
  Backward,
  BackwardInput,
  BackwardWeight,
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
};
// "F", "B", "I", "W", "SF", "RF", "SB", "RB".
const char* shortName(ActionKind kind);
bool isCompute(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Action&) const = default;
  // "F(stage 1, micro-batch 3)".
  std::string str() const;
  // "F3" (with the stage: "F3s1").
  std::string shortStr(bool withStage = false) const;
};

struct Schedule {
  std::string name{};  // "gpipe", "1f1b", "interleaved", "v", "zb", or a user's
  int ranks = 1;
  int stages = 1;
  int microbatches = 1;
  std::vector<int> placement{};                // stage -> rank; size `stages`
  std::vector<std::vector<Action>> actions{};  // per rank, in execution order

  int rankOf(int stage) const { return placement.at(static_cast<size_t>(stage)); }
  // The stages on `rank`, ascending.
  std::vector<int> stagesOf(int rank) const;
  // Whether any action is a send or a receive.
  bool hasCommunication() const;
  // Whether backward is split into I and W.
  bool splitsBackward() const;
};

// Stage s on rank s % ranks (one stage per rank when stages == ranks).
std::vector<int> loopedPlacement(int ranks, int stages);
// Two stages per rank in a V: stage s on rank s for s < ranks, on rank 2 ranks - 1 - s after, so
// rank r holds stages r and 2 ranks - 1 - r, and the first rank holds the first stage and the last.
std::vector<int> vPlacement(int ranks);

// Fill-drain: every forward, then every backward (GPipe). Peak activations: m on every rank.
Schedule gpipe(int ranks, int microbatches);
// One forward, one backward (PipeDream-flush / Megatron): rank r runs ranks - r - 1 forwards
// ahead, then alternates. Peak activations ranks - r.
//
// `lookahead` (here, in interleaved1F1B and in zeroBubble; 0 is the schedule as published):
// every rank that feeds a later stage runs that many more forwards ahead, and holds that many more
// micro-batches' activations. With equal, steady costs it changes nothing. With real ones it
// decouples the ranks: in plain 1F1B a rank's next forward waits for the gradient of its previous
// micro-batch, so any delay on either rank (a slow action, a transfer, another process taking the
// core) stalls both; one forward in reserve lets the next stage keep computing through it.
Schedule oneFOneB(int ranks, int microbatches, int lookahead = 0);
// Interleaved 1F1B (Megatron-LM): `chunks` stages per rank, stage s on rank s % ranks; micro-
// batches move through the chunks in groups of `ranks`. Needs microbatches % ranks == 0.
// Bubble (p - 1) / (v m + p - 1) with equal costs (p ranks, v chunks, m micro-batches).
Schedule interleaved1F1B(int ranks, int chunks, int microbatches, int lookahead = 0);
// V-shaped 1F1B ("v"): 2 ranks stages in vPlacement, so a micro-batch goes down the ranks and back
// up, its loss and the start of its backward on the first rank, next to its first forward. Any
// number of micro-batches. Built by list scheduling with unit costs (forward 1, backward 2) on the
// critical path: each rank, when free, runs the action that can start soonest, and of those the one
// with the longest chain of actions after it to the end of the step (its bottom level, which puts
// the backward chain and the earlier micro-batches first). A rank starts a forward of its first
// stage only while fewer than 2 ranks + 1 + lookahead stages' activations are live on it (a V stage
// is half a 1F1B stage, so that is about 1F1B's first rank's memory); forwards of the second stage
// are never held back, so the peak can exceed it by a little (by at most two up to 8 ranks and 32
// micro-batches, schedule tests). Every rank but the first waits at the start for one forward per
// rank before it; the step ends with the first rank's backwards, where a split tail (splitTail) has
// the other ranks' weight halves fill the wait. With unit costs its bubble never exceeds 1F1B's,
// and at p = 2 it is interleaved 1F1B's (m = 8: 1/17, against 1F1B's 1/9). It is for stages of
// unequal cost where the last is the dearest (a language model's head and loss): the rank holding
// it starts at the step's first moment and ends it, and a micro-batch crosses between ranks twice
// each way instead of 2 ranks - 1 times as in interleaved.
Schedule vShape1F1B(int ranks, int microbatches, int lookahead = 0);
// Zero bubble (ZB-H1 family): backward split into I and W; the in-flight forwards per rank are
// bounded as in 1F1B (ranks - r between a forward and its input backward) and W runs whenever
// no forward or input backward is ready, keeping at most ranks - 1 weight backwards postponed.
// With unit F, I, W costs its bubble is (p - 1) / (3m + p - 1) for m >= p, a third of 1F1B's.
Schedule zeroBubble(int ranks, int microbatches, int lookahead = 0);
// By name: "gpipe", "1f1b", "interleaved" (uses `chunks`, default 2), "v" (always 2 chunks),
// "zb". ScheduleError for another name, for chunks with a schedule other than interleaved (and
// other than 2 with "v"), and for a lookahead with gpipe (it runs every forward first already) or
// a negative one.
Schedule makeSchedule(const std::string& name, int ranks, int microbatches, int chunks = 0, int lookahead = 0);
// The built-in names.
std::vector<std::string> scheduleNames();

// The schedule with sends and receives inserted (a copy; one that has them already is returned
// unchanged).
Schedule withCommunication(const Schedule& schedule);

struct ActionCosts {
  // Per stage (one value: every stage). Time of a forward, a full backward, and the two halves
  // of a split backward.
  std::vector<double> forward{1.0};
  std::vector<double> backward{2.0};
  std::vector<double> backwardInput{1.0};
  std::vector<double> backwardWeight{1.0};
  double send = 0.0;     // time a send keeps its rank busy
  double recv = 0.0;     // time a receive keeps its rank busy once the data is there
  double latency = 0.0;  // from the end of a send to the data being at the receiver
  // Per micro-batch: a factor on its compute actions' costs (its rows over the rows the costs
  // above were measured at), for micro-batches of unequal sizes. Empty: 1 for every one.
  std::vector<double> microbatchScale{};
  double of(const Action& a) const;
};

struct TimedAction {
  Action action{};
  double start = 0;
  double end = 0;
};

struct Simulation {
  double makespan = 0;
  std::vector<double> busy{};                        // per rank: compute time (F, B, I, W)
  double bubble = 0;                                 // 1 - sum(busy) / (ranks * makespan)
  std::vector<int> peakActivations{};                // per rank: live micro-batch activations
  std::vector<std::vector<TimedAction>> timeline{};  // per rank, in execution order
};

// Checks `schedule` (lowered with withCommunication when it has no sends or receives) and times
// it. Throws ScheduleError as check() does.
Simulation simulate(const Schedule& schedule, const ActionCosts& costs = {});
// simulate() with unit costs, for its checks alone.
void check(const Schedule& schedule);

// Zero bubble where the bubble is: `schedule` with the full backwards (B) of its last `k`
// micro-batches split into an input half (I) and a weight half (W), on every stage
// but the first (whose input gradient nobody waits for). At the end of a step each rank waits for
// the gradients of the ranks after it; run as I, a backward hands its gradient on a W earlier,
// and the postponed Ws fill the waits. Every rank keeps its order of F, B and I; a postponed W
// runs whenever the rank's next action would wait (timed with `costs`; the default unit costs
// suit any balanced pipeline), and the ones left run at the rank's end. Only the last few are
// split because splitting costs compute (the two halves together cost a few percent more than
// B) and holds activations until W. The knees: k = ranks - 1 for 1F1B, k = ranks for interleaved
// (p = 2, m = 8 in bench/pipeline, simulated with its measured costs: 1f1b 81.4 -> 79.1 ms,
// interleaved 74.5 -> 72.7); k = microbatches splits every backward. With unit costs the result
// is never slower than `schedule`.
// Named "<name>+split<k>". ScheduleError for a schedule that check() refuses, one with sends or
// receives already (it is placed before they are inserted), or k outside 0..microbatches; the
// costs are checked as simulate() checks them.
Schedule splitTail(const Schedule& schedule, int k, const ActionCosts& costs = {});

// A text picture: a row per rank, a column per `unit` of time (default: the shortest compute
// action), each compute action drawn as its short name padded to its length, idle time as dots.
std::string formatTimeline(const Simulation& sim, double unit = 0);
// The same as an SVG image (a coloured box per action, labelled).
std::string timelineSvg(const Simulation& sim, const std::string& title = "");

}  // namespace cohort::pipeline
