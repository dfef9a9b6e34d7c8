#include <cohort/pipeline/schedule.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>

namespace cohort::pipeline {

namespace {

constexpr int kKinds = 8;

void checkShape(int ranks, int microbatches, const char* what) {
  if (ranks < 1) throw ScheduleError(fmt::format("{}: needs at least one rank, got {}", what, ranks));
  if (microbatches < 1)
    throw ScheduleError(fmt::format("{}: needs at least one micro-batch, got {}", what, microbatches));
}

void checkLookahead(int lookahead, const char* what) {
  if (lookahead < 0)
    throw ScheduleError(fmt::format("{}: the lookahead counts extra forwards run ahead, so it cannot be negative "
                                    "(got {})",
                                    what, lookahead));
}

// The extra forwards rank r runs ahead: `lookahead` when it holds a stage that feeds a later one
// (every rank with several chunks; else every rank but the last, whose backward follows its own
// forward and gains nothing by running ahead).
int aheadOn(int r, int ranks, int chunks, int lookahead) { return chunks > 1 || r < ranks - 1 ? lookahead : 0; }

Schedule blank(std::string name, int ranks, int stages, int microbatches) {
  Schedule s;
  s.name = std::move(name);
  s.ranks = ranks;
  s.stages = stages;
  s.microbatches = microbatches;
  s.placement = loopedPlacement(ranks, stages);
  s.actions.resize(static_cast<size_t>(ranks));
  return s;
}

}  // namespace

const char* shortName(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::BackwardInput: return "I";
    case ActionKind::BackwardWeight: return "W";
    case ActionKind::SendActivation: return "SF";
    case ActionKind::RecvActivation: return "RF";
    case ActionKind::SendGradient: return "SB";
    case ActionKind::RecvGradient: return "RB";
  }
  return "?";
}

bool isCompute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::BackwardInput ||
         kind == ActionKind::BackwardWeight;
}

std::string Action::str() const {
  return fmt::format("{}(stage {}, micro-batch {})", shortName(kind), stage, microbatch);
}

std::string Action::shortStr(bool withStage) const {
  return withStage ? fmt::format("{}{}s{}", shortName(kind), microbatch, stage)
                   : fmt::format("{}{}", shortName(kind), microbatch);
}

std::vector<int> Schedule::stagesOf(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < stages; ++s)
    if (placement[static_cast<size_t>(s)] == rank) out.push_back(s);
  return out;
}

bool Schedule::hasCommunication() const {
  for (const auto& list : actions)
    for (const Action& a : list)
      if (!isCompute(a.kind)) return true;
  return false;
}

bool Schedule::splitsBackward() const {
  for (const auto& list : actions)
    for (const Action& a : list)
      if (a.kind == ActionKind::BackwardInput || a.kind == ActionKind::BackwardWeight) return true;
  return false;
}

std::vector<int> loopedPlacement(int ranks, int stages) {
  std::vector<int> p(static_cast<size_t>(std::max(stages, 0)));
  for (int s = 0; s < stages; ++s) p[static_cast<size_t>(s)] = s % std::max(ranks, 1);
  return p;
}

std::vector<int> vPlacement(int ranks) {
  const int p = std::max(ranks, 1);
  std::vector<int> out(static_cast<size_t>(2 * p));
  for (int r = 0; r < p; ++r) out[static_cast<size_t>(r)] = out[static_cast<size_t>(2 * p - 1 - r)] = r;
  return out;
}

Schedule gpipe(int ranks, int microbatches) {
  checkShape(ranks, microbatches, "gpipe");
  Schedule s = blank("gpipe", ranks, ranks, microbatches);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < microbatches; ++i) s.actions[r].push_back({ActionKind::Forward, r, i});
    for (int i = 0; i < microbatches; ++i) s.actions[r].push_back({ActionKind::Backward, r, i});
  }
  return s;
}

Schedule oneFOneB(int ranks, int microbatches, int lookahead) {
  checkShape(ranks, microbatches, "1f1b");
  checkLookahead(lookahead, "1f1b");
  Schedule s = blank("1f1b", ranks, ranks, microbatches);
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(ranks - r - 1 + aheadOn(r, ranks, 1, lookahead), microbatches);
    int f = 0, b = 0;
    while (f < warmup) list.push_back({ActionKind::Forward, r, f++});
    while (f < microbatches) {
      list.push_back({ActionKind::Forward, r, f++});
      list.push_back({ActionKind::Backward, r, b++});
    }
    while (b < microbatches) list.push_back({ActionKind::Backward, r, b++});
  }
  return s;
}

Schedule interleaved1F1B(int ranks, int chunks, int microbatches, int lookahead) {
  checkShape(ranks, microbatches, "interleaved");
  checkLookahead(lookahead, "interleaved");
  if (chunks < 1) throw ScheduleError(fmt::format("interleaved: needs at least one chunk per rank, got {}", chunks));
  if (microbatches % ranks != 0)
    throw ScheduleError(fmt::format(
        "interleaved: {} micro-batches do not divide into groups of {} ranks (the interleaved schedule moves "
        "micro-batches through the chunks {} at a time; use a multiple of {}, or 1f1b/gpipe/zb)",
        microbatches, ranks, ranks, ranks));
  Schedule s = blank("interleaved", ranks, ranks * chunks, microbatches);
  // The k-th forward (backward) of a rank: micro-batches in groups of `ranks`, each group through
  // chunk 0, 1, ... (backward: the last chunk first).
  auto order = [&](int k, bool backward) {
    const int group = k / (ranks * chunks), within = k % (ranks * chunks);
    int chunk = within / ranks;
    if (backward) chunk = chunks - 1 - chunk;
    return std::pair<int, int>{chunk, group * ranks + within % ranks};
  };
  const int total = microbatches * chunks;
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup =
        std::min((ranks - r - 1) * 2 + (chunks - 1) * ranks + aheadOn(r, ranks, chunks, lookahead), total);
    int f = 0, b = 0;
    auto fwd = [&] {
      auto [c, i] = order(f++, false);
      list.push_back({ActionKind::Forward, c * ranks + r, i});
    };
    auto bwd = [&] {
      auto [c, i] = order(b++, true);
      list.push_back({ActionKind::Backward, c * ranks + r, i});
    };
    while (f < warmup) fwd();
    while (f < total) {
      fwd();
      bwd();
    }
    while (b < total) bwd();
  }
  return s;
}

Schedule vShape1F1B(int ranks, int microbatches, int lookahead) {
  checkShape(ranks, microbatches, "v");
  checkLookahead(lookahead, "v");
  const int p = ranks, m = microbatches, S = 2 * ranks;
  Schedule s = blank("v", p, S, m);
  s.placement = vPlacement(p);
  auto at = [m](int stage, int mb) { return static_cast<size_t>(stage * m + mb); };
  // Each action's bottom level with unit costs (forward 1, backward 2): the longest chain of
  // actions from its start to the end of the step. A forward is followed by the next stage's
  // forward (the last stage: its own backward) and by its stage's next micro-batch; a backward by
  // the previous stage's backward and its stage's next micro-batch.
  std::vector<int> levelF(static_cast<size_t>(S * m)), levelB(static_cast<size_t>(S * m));
  for (int i = m - 1; i >= 0; --i)
    for (int st = 0; st < S; ++st)
      levelB[at(st, i)] = 2 + std::max(st > 0 ? levelB[at(st - 1, i)] : 0, i + 1 < m ? levelB[at(st, i + 1)] : 0);
  for (int i = m - 1; i >= 0; --i)
    for (int st = S - 1; st >= 0; --st)
      levelF[at(st, i)] =
          1 + std::max(st + 1 < S ? levelF[at(st + 1, i)] : levelB[at(st, i)], i + 1 < m ? levelF[at(st, i + 1)] : 0);
  // List scheduling (schedule.h): when each stage's forward and backward of each micro-batch
  // ends, -1 until it has run.
  const int limit = 2 * p + 1 + lookahead;
  std::vector<int> fEnd(static_cast<size_t>(S * m), -1), bEnd(static_cast<size_t>(S * m), -1);
  std::vector<int> nextF(static_cast<size_t>(S), 0), nextB(static_cast<size_t>(S), 0);
  std::vector<int> freeAt(static_cast<size_t>(p), 0), live(static_cast<size_t>(p), 0);
  struct Pick {
    int rank = -1, stage = -1;
    bool backward = false;
    int start = std::numeric_limits<int>::max(), level = -1;
  };
  for (int done = 0; done < 2 * S * m; ++done) {
    Pick best;
    for (int r = 0; r < p; ++r) {
      const auto ru = static_cast<size_t>(r);
      for (const int st : {r, S - 1 - r}) {
        const auto su = static_cast<size_t>(st);
        auto offer = [&](int ready, bool backward, int level) {
          const int start = std::max(ready, freeAt[ru]);
          if (start < best.start || (start == best.start && level > best.level)) best = {r, st, backward, start, level};
        };
        if (const int i = nextB[su]; i < m) {
          const int f = fEnd[at(st, i)], g = st + 1 < S ? bEnd[at(st + 1, i)] : 0;
          if (f >= 0 && g >= 0) offer(std::max(f, g), true, levelB[at(st, i)]);
        }
        if (const int i = nextF[su]; i < m && (st >= p || live[ru] < limit)) {
          const int e = st > 0 ? fEnd[at(st - 1, i)] : 0;
          if (e >= 0) offer(e, false, levelF[at(st, i)]);
        }
      }
    }
    // Something can always start: a rank held back by its limit has live micro-batches, whose
    // backwards become ready once the ranks after it (never held back on their second stages)
    // have run.
    if (best.rank < 0) throw Error("v: internal error: no action can start");
    const auto ru = static_cast<size_t>(best.rank), su = static_cast<size_t>(best.stage);
    const int i = best.backward ? nextB[su]++ : nextF[su]++;
    freeAt[ru] = best.start + (best.backward ? 2 : 1);
    (best.backward ? bEnd : fEnd)[at(best.stage, i)] = freeAt[ru];
    live[ru] += best.backward ? -1 : 1;
    s.actions[ru].push_back({best.backward ? ActionKind::Backward : ActionKind::Forward, best.stage, i});
  }
  return s;
}

Schedule zeroBubble(int ranks, int microbatches, int lookahead) {
  checkShape(ranks, microbatches, "zb");
  checkLookahead(lookahead, "zb");
  Schedule s = blank("zb", ranks, ranks, microbatches);
  // List scheduling with unit F, I and W: each rank, when free, starts the first action that can
  // start soonest, preferring I, then F, then W; a forward may start only while fewer than
  // ranks - r forwards wait for their input backward, and fewer than 2 ranks - r - 1 forwards
  // wait for their weight backward (each bound raised by `lookahead` on every rank but the last).
  const int p = ranks, m = microbatches;
  std::vector<double> freeAt(p, 0.0);
  std::vector<int> nextF(p, 0), nextI(p, 0);
  std::vector<std::deque<int>> pendingW(static_cast<size_t>(p));
  std::map<std::pair<int, int>, double> fEnd, iEnd;  // (rank, micro-batch) -> end
  const int totalActions = 3 * m * p;
  for (int done = 0; done < totalActions; ++done) {
    int bestRank = -1, bestPrio = 0;
    double bestStart = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      double start = std::numeric_limits<double>::infinity();
      int prio = 3;
      auto consider = [&](double ready, int pr) {
        double st = std::max(freeAt[r], ready);
        if (st < start || (st == start && pr < prio)) start = st, prio = pr;
      };
      const int i = nextI[r];
      if (i < m && fEnd.contains({r, i}) && (r == p - 1 || iEnd.contains({r + 1, i})))
        consider(std::max(fEnd[{r, i}], r == p - 1 ? 0.0 : iEnd[{r + 1, i}]), 0);
      const int f = nextF[r];
      const int inFlight = f - nextI[r], unfinished = f - (nextI[r] - static_cast<int>(pendingW[r].size()));
      const int ahead = aheadOn(r, p, 1, lookahead);
      if (f < m && inFlight < p - r + ahead && unfinished < 2 * p - r - 1 + ahead &&
          (r == 0 || fEnd.contains({r - 1, f})))
        consider(r == 0 ? 0.0 : fEnd[{r - 1, f}], 1);
      if (!pendingW[r].empty()) consider(0.0, 2);
      if (prio < 3 && start < bestStart) bestStart = start, bestRank = r, bestPrio = prio;
    }
    if (bestRank < 0) throw Error("zb: internal error: no action can start");  // cannot happen
    const int r = bestRank;
    freeAt[r] = bestStart + 1.0;
    auto& list = s.actions[static_cast<size_t>(r)];
    if (bestPrio == 0) {
      const int i = nextI[r]++;
      iEnd[{r, i}] = freeAt[r];
      pendingW[r].push_back(i);
      list.push_back({ActionKind::BackwardInput, r, i});
    } else if (bestPrio == 1) {
      const int f = nextF[r]++;
      fEnd[{r, f}] = freeAt[r];
      list.push_back({ActionKind::Forward, r, f});
    } else {
      list.push_back({ActionKind::BackwardWeight, r, pendingW[r].front()});
      pendingW[r].pop_front();
    }
  }
  return s;
}

std::vector<std::string> scheduleNames() { return {"gpipe", "1f1b", "interleaved", "v", "zb"}; }

Schedule makeSchedule(const std::string& name, int ranks, int microbatches, int chunks, int lookahead) {
  if (name == "interleaved") return interleaved1F1B(ranks, chunks > 0 ? chunks : 2, microbatches, lookahead);
  if (name == "v") {
    if (chunks != 0 && chunks != 2)
      throw ScheduleError(fmt::format("schedule 'v' holds two stages per rank, not {} chunks", chunks));
    return vShape1F1B(ranks, microbatches, lookahead);
  }
  if (chunks > 1)
    throw ScheduleError(
        fmt::format("schedule '{}' runs one stage per rank; only 'interleaved' takes {} chunks", name, chunks));
  if (name == "gpipe") {
    if (lookahead != 0)
      throw ScheduleError(fmt::format("gpipe runs every forward first; a lookahead ({}) applies to 1f1b, v, "
                                      "interleaved and zb",
                                      lookahead));
    return gpipe(ranks, microbatches);
  }
  if (name == "1f1b") return oneFOneB(ranks, microbatches, lookahead);
  if (name == "zb") return zeroBubble(ranks, microbatches, lookahead);
  throw ScheduleError(fmt::format("unknown pipeline schedule '{}' (known: gpipe, 1f1b, interleaved, v, zb)", name));
}

Schedule withCommunication(const Schedule& in) {
  if (in.hasCommunication()) return in;
  Schedule out = in;
  for (auto& list : out.actions) list.clear();
  const int S = in.stages;
  for (size_t r = 0; r < in.actions.size(); ++r) {
    auto& list = out.actions[r];
    for (const Action& a : in.actions[r]) {
      const int s = a.stage, i = a.microbatch;
      const bool prevRemote = s > 0 && s - 1 < S && in.rankOf(s - 1) != static_cast<int>(r);
      const bool nextRemote = s + 1 < S && in.rankOf(s + 1) != static_cast<int>(r);
      const bool isBack = a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput;
      if (a.kind == ActionKind::Forward && prevRemote) list.push_back({ActionKind::RecvActivation, s, i});
      if (isBack && nextRemote) list.push_back({ActionKind::RecvGradient, s, i});
      list.push_back(a);
      if (a.kind == ActionKind::Forward && nextRemote) list.push_back({ActionKind::SendActivation, s, i});
      if (isBack && prevRemote) list.push_back({ActionKind::SendGradient, s, i});
    }
  }
  return out;
}

double ActionCosts::of(const Action& a) const {
  auto pick = [&](const std::vector<double>& v) {
    if (v.empty()) return 0.0;
    const double scale = microbatchScale.empty() ? 1.0 : microbatchScale.at(static_cast<size_t>(a.microbatch));
    return scale * (v.size() == 1 ? v[0] : v.at(static_cast<size_t>(a.stage)));
  };
  switch (a.kind) {
    case ActionKind::Forward: return pick(forward);
    case ActionKind::Backward: return pick(backward);
    case ActionKind::BackwardInput: return pick(backwardInput);
    case ActionKind::BackwardWeight: return pick(backwardWeight);
    case ActionKind::SendActivation:
    case ActionKind::SendGradient: return send;
    case ActionKind::RecvActivation:
    case ActionKind::RecvGradient: return recv;
  }
  return 0.0;
}

namespace {

// Where each action of a schedule is, and the checks that need no timing.
class Index {
 public:
  explicit Index(const Schedule& s) : s_(s), stages_(s.stages), microbatches_(s.microbatches) {
    where_.assign(static_cast<size_t>(kKinds * stages_ * microbatches_), {-1, -1});
  }
  size_t key(ActionKind k, int stage, int mb) const {
    return (static_cast<size_t>(k) * static_cast<size_t>(stages_) + static_cast<size_t>(stage)) *
               static_cast<size_t>(microbatches_) +
           static_cast<size_t>(mb);
  }
  // (rank, position) of an action; rank -1 when the schedule does not have it.
  std::pair<int, int> where(ActionKind k, int stage, int mb) const { return where_[key(k, stage, mb)]; }
  bool has(ActionKind k, int stage, int mb) const { return where(k, stage, mb).first >= 0; }

  void build() {
    if (s_.ranks < 1 || s_.stages < 1 || s_.microbatches < 1)
      throw ScheduleError(fmt::format("schedule '{}': needs at least one rank, stage and micro-batch (has {}, {}, {})",
                                      s_.name, s_.ranks, s_.stages, s_.microbatches));
    if (static_cast<int>(s_.placement.size()) != stages_)
      throw ScheduleError(fmt::format("schedule '{}': placement names {} stages, the schedule has {}", s_.name,
                                      s_.placement.size(), stages_));
    for (int st = 0; st < stages_; ++st)
      if (s_.rankOf(st) < 0 || s_.rankOf(st) >= s_.ranks)
        throw ScheduleError(fmt::format("schedule '{}': stage {} is placed on rank {}, outside 0..{}", s_.name, st,
                                        s_.rankOf(st), s_.ranks - 1));
    if (static_cast<int>(s_.actions.size()) != s_.ranks)
      throw ScheduleError(fmt::format("schedule '{}': has action lists for {} ranks, expected {}", s_.name,
                                      s_.actions.size(), s_.ranks));
    for (int r = 0; r < s_.ranks; ++r) {
      const auto& list = s_.actions[static_cast<size_t>(r)];
      for (int pos = 0; pos < static_cast<int>(list.size()); ++pos) {
        const Action& a = list[static_cast<size_t>(pos)];
        auto bad = [&](const std::string& why) {
          return ScheduleError(fmt::format("schedule '{}': rank {} action {} ({}) {}", s_.name, r, pos, a.str(), why));
        };
        if (a.stage < 0 || a.stage >= stages_) throw bad(fmt::format("names a stage outside 0..{}", stages_ - 1));
        if (a.microbatch < 0 || a.microbatch >= microbatches_)
          throw bad(fmt::format("names a micro-batch outside 0..{}", microbatches_ - 1));
        if (s_.rankOf(a.stage) != r)
          throw bad(fmt::format("is on the wrong rank: stage {} is on rank {}", a.stage, s_.rankOf(a.stage)));
        const int peer = [&] {
          switch (a.kind) {
            case ActionKind::SendActivation:
            case ActionKind::RecvGradient:
              if (a.stage + 1 >= stages_) throw bad("communicates with a stage after the last one");
              return s_.rankOf(a.stage + 1);
            case ActionKind::RecvActivation:
            case ActionKind::SendGradient:
              if (a.stage == 0) throw bad("communicates with a stage before the first one");
              return s_.rankOf(a.stage - 1);
            default: return -1;
          }
        }();
        if (peer == r) throw bad("sends or receives between two stages of one rank, which hand tensors over in memory");
        auto& w = where_[key(a.kind, a.stage, a.microbatch)];
        if (w.first >= 0) throw bad(fmt::format("repeats the action at rank {} position {}", w.first, w.second));
        w = {r, pos};
      }
    }
    // Every forward and backward, once; sends and receives in matching pairs.
    for (int st = 0; st < stages_; ++st) {
      for (int i = 0; i < microbatches_; ++i) {
        const int r = s_.rankOf(st);
        auto missing = [&](const std::string& what) {
          return ScheduleError(fmt::format("schedule '{}': rank {} never runs {} of micro-batch {} on stage {}",
                                           s_.name, r, what, i, st));
        };
        if (!has(ActionKind::Forward, st, i)) throw missing("the forward (F)");
        const bool full = has(ActionKind::Backward, st, i);
        const bool in = has(ActionKind::BackwardInput, st, i), wt = has(ActionKind::BackwardWeight, st, i);
        if (full && (in || wt))
          throw ScheduleError(fmt::format("schedule '{}': micro-batch {} on stage {} has both a full backward (B) and "
                                          "a split one (I/W)",
                                          s_.name, i, st));
        if (!full && !in) throw missing(wt ? "the input backward (I) before its W" : "the backward (B, or I and W)");
        if (in && !wt) throw missing("the weight backward (W) after its I");
      }
    }
    if (!s_.hasCommunication()) return;
    for (int st = 0; st + 1 < stages_; ++st) {
      if (s_.rankOf(st) == s_.rankOf(st + 1)) continue;
      for (int i = 0; i < microbatches_; ++i) {
        pair(ActionKind::SendActivation, st, ActionKind::RecvActivation, st + 1, i);
        pair(ActionKind::SendGradient, st + 1, ActionKind::RecvGradient, st, i);
      }
    }
  }

 private:
  void pair(ActionKind sendKind, int sendStage, ActionKind recvKind, int recvStage, int i) const {
    const Action send{sendKind, sendStage, i}, recv{recvKind, recvStage, i};
    const bool hs = has(sendKind, sendStage, i), hr = has(recvKind, recvStage, i);
    if (hs && hr) return;
    if (hs)
      throw ScheduleError(fmt::format("schedule '{}': {} on rank {} has no matching {} on rank {}", s_.name, send.str(),
                                      s_.rankOf(sendStage), recv.str(), s_.rankOf(recvStage)));
    if (hr)
      throw ScheduleError(fmt::format("schedule '{}': {} on rank {} has no matching {} on rank {}", s_.name, recv.str(),
                                      s_.rankOf(recvStage), send.str(), s_.rankOf(sendStage)));
    throw ScheduleError(fmt::format("schedule '{}': {} is never sent: neither {} on rank {} nor {} on rank {} is in "
                                    "the schedule",
                                    s_.name, sendKind == ActionKind::SendActivation ? "an activation" : "a gradient",
                                    send.str(), s_.rankOf(sendStage), recv.str(), s_.rankOf(recvStage)));
  }

  const Schedule& s_;
  int stages_, microbatches_;
  std::vector<std::pair<int, int>> where_;
};

}  // namespace

Simulation simulate(const Schedule& input, const ActionCosts& costs) {
  // The schedule as given first (its errors name its own positions), then with communication.
  Index(input).build();
  if (!costs.microbatchScale.empty()) {
    if (static_cast<int>(costs.microbatchScale.size()) != input.microbatches)
      throw ValueError(fmt::format("simulate: microbatchScale has {} factors for schedule '{}' of {} micro-batches",
                                   costs.microbatchScale.size(), input.name, input.microbatches));
    for (size_t i = 0; i < costs.microbatchScale.size(); ++i)
      if (!(costs.microbatchScale[i] >= 0) || !std::isfinite(costs.microbatchScale[i]))
        throw ValueError(fmt::format("simulate: microbatchScale[{}] is {}; factors are finite and non-negative", i,
                                     costs.microbatchScale[i]));
  }
  const Schedule s = withCommunication(input);
  Index index(s);
  index.build();
  const int R = s.ranks, S = s.stages;
  std::vector<double> doneAt(static_cast<size_t>(kKinds * S * s.microbatches), -1.0);
  auto doneTime = [&](ActionKind k, int st, int i) { return doneAt[index.key(k, st, i)]; };
  // The backward that hands stage st's input gradient on: B, or I when split.
  auto gradKind = [&](int st, int i) {
    return index.has(ActionKind::Backward, st, i) ? ActionKind::Backward : ActionKind::BackwardInput;
  };
  // The actions `a` (on rank r) waits for, with the delay after each one's end.
  auto dependencies = [&](const Action& a, int r) {
    std::vector<std::pair<Action, double>> deps;
    const int st = a.stage, i = a.microbatch;
    switch (a.kind) {
      case ActionKind::Forward:
        if (st > 0) {
          if (s.rankOf(st - 1) == r) deps.push_back({{ActionKind::Forward, st - 1, i}, 0.0});
          else deps.push_back({{ActionKind::RecvActivation, st, i}, 0.0});
        }
        break;
      case ActionKind::RecvActivation: deps.push_back({{ActionKind::SendActivation, st - 1, i}, costs.latency}); break;
      case ActionKind::SendActivation: deps.push_back({{ActionKind::Forward, st, i}, 0.0}); break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
        deps.push_back({{ActionKind::Forward, st, i}, 0.0});
        if (st + 1 < S) {
          if (s.rankOf(st + 1) == r) deps.push_back({{gradKind(st + 1, i), st + 1, i}, 0.0});
          else deps.push_back({{ActionKind::RecvGradient, st, i}, 0.0});
        }
        break;
      case ActionKind::RecvGradient: deps.push_back({{ActionKind::SendGradient, st + 1, i}, costs.latency}); break;
      case ActionKind::SendGradient: deps.push_back({{gradKind(st, i), st, i}, 0.0}); break;
      case ActionKind::BackwardWeight: deps.push_back({{ActionKind::BackwardInput, st, i}, 0.0}); break;
    }
    return deps;
  };

  Simulation sim;
  sim.busy.assign(static_cast<size_t>(R), 0.0);
  sim.peakActivations.assign(static_cast<size_t>(R), 0);
  sim.timeline.resize(static_cast<size_t>(R));
  std::vector<size_t> pc(static_cast<size_t>(R), 0);
  std::vector<double> freeAt(static_cast<size_t>(R), 0.0);
  std::vector<int> live(static_cast<size_t>(R), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      const auto& list = s.actions[static_cast<size_t>(r)];
      while (pc[r] < list.size()) {
        const Action& a = list[pc[r]];
        double ready = freeAt[r];
        bool blocked = false;
        for (const auto& [dep, delay] : dependencies(a, r)) {
          const double t = doneTime(dep.kind, dep.stage, dep.microbatch);
          if (t < 0) {
            blocked = true;
            break;
          }
          ready = std::max(ready, t + delay);
        }
        if (blocked) break;
        const double end = ready + costs.of(a);
        doneAt[index.key(a.kind, a.stage, a.microbatch)] = end;
        freeAt[r] = end;
        sim.timeline[r].push_back({a, ready, end});
        if (isCompute(a.kind)) sim.busy[r] += end - ready;
        if (a.kind == ActionKind::Forward) sim.peakActivations[r] = std::max(sim.peakActivations[r], ++live[r]);
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --live[r];
        sim.makespan = std::max(sim.makespan, end);
        ++pc[r];
        progress = true;
      }
    }
  }
  // Deadlock: follow who waits for whom from the first rank that is stuck.
  int first = -1;
  for (int r = 0; r < R && first < 0; ++r)
    if (pc[r] < s.actions[static_cast<size_t>(r)].size()) first = r;
  if (first >= 0) {
    std::string chain;
    std::vector<bool> seen(static_cast<size_t>(R), false);
    for (int r = first; r >= 0 && !seen[r];) {
      seen[r] = true;
      const Action& a = s.actions[static_cast<size_t>(r)][pc[r]];
      Action missing{};
      for (const auto& [dep, delay] : dependencies(a, r))
        if (doneTime(dep.kind, dep.stage, dep.microbatch) < 0) {
          missing = dep;
          break;
        }
      auto [owner, pos] = index.where(missing.kind, missing.stage, missing.microbatch);
      chain += fmt::format("{}rank {} waits at action {} ({}) for {}", chain.empty() ? "" : "; ", r, pc[r], a.str(),
                           missing.str());
      if (owner == r) {
        chain += fmt::format(", which comes later on rank {} (action {})", r, pos);
        break;
      }
      chain += fmt::format(" on rank {}", owner);
      r = owner;
      if (r >= 0 && seen[r]) chain += ", which waits in turn: a cycle";
    }
    throw ScheduleError(fmt::format("schedule '{}' deadlocks: {}", s.name, chain));
  }
  double total = 0;
  for (double b : sim.busy) total += b;
  sim.bubble = sim.makespan > 0 ? 1.0 - total / (static_cast<double>(R) * sim.makespan) : 0.0;
  return sim;
}

void check(const Schedule& schedule) { (void)simulate(schedule); }

Schedule splitTail(const Schedule& in, int k, const ActionCosts& costs) {
  if (in.hasCommunication())
    throw ScheduleError(fmt::format("splitTail: schedule '{}' has its sends and receives already; split its backwards "
                                    "first (withCommunication places the transfers around them)",
                                    in.name));
  if (k < 0 || k > in.microbatches)
    throw ScheduleError(fmt::format("splitTail: cannot split the backwards of the last {} micro-batches of schedule "
                                    "'{}', which has {} (0..{})",
                                    k, in.name, in.microbatches, in.microbatches));
  (void)simulate(in, costs);  // the schedule and the costs, checked
  if (k == 0) return in;
  const int p = in.ranks, S = in.stages, m = in.microbatches;
  Schedule out = in;
  out.name = fmt::format("{}+split{}", in.name, k);
  for (auto& list : out.actions) list.clear();
  // List scheduling: when each stage's forward, and the backward that produces its input
  // gradient (B or I), ends; negative until it has run.
  std::vector<double> fEnd(static_cast<size_t>(S * m), -1.0), gEnd(static_cast<size_t>(S * m), -1.0);
  auto at = [m](int stage, int mb) { return static_cast<size_t>(stage * m + mb); };
  auto handover = [&](int from, int to) { return in.rankOf(from) == in.rankOf(to) ? 0.0 : costs.send + costs.latency; };
  auto readyAt = [&](const Action& a) -> std::optional<double> {
    const int st = a.stage, i = a.microbatch;
    if (a.kind == ActionKind::BackwardWeight) return 0.0;  // its I runs before it on this rank
    if (a.kind == ActionKind::Forward) {
      if (st == 0) return 0.0;
      const double e = fEnd[at(st - 1, i)];
      if (e < 0) return std::nullopt;
      return e + handover(st - 1, st);
    }
    double e = fEnd[at(st, i)];
    if (e < 0) return std::nullopt;
    if (st + 1 < S) {
      const double g = gEnd[at(st + 1, i)];
      if (g < 0) return std::nullopt;
      e = std::max(e, g + handover(st + 1, st));
    }
    return e;
  };
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> freeAt(static_cast<size_t>(p), 0.0);
  std::vector<std::deque<Action>> postponed(static_cast<size_t>(p));
  for (;;) {
    int best = -1;
    bool bestIsW = false;
    double bestStart = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      const auto ru = static_cast<size_t>(r);
      const auto& list = in.actions[ru];
      std::optional<double> ready;
      if (next[ru] < list.size()) ready = readyAt(list[next[ru]]);
      double start = ready ? std::max(*ready, freeAt[ru]) : std::numeric_limits<double>::infinity();
      bool isW = false;
      if (!postponed[ru].empty() && start > freeAt[ru]) start = freeAt[ru], isW = true;
      if (start < bestStart) bestStart = start, best = r, bestIsW = isW;
    }
    if (best < 0) break;
    const auto r = static_cast<size_t>(best);
    auto& list = out.actions[r];
    if (bestIsW) {
      list.push_back(postponed[r].front());
      postponed[r].pop_front();
      freeAt[r] = bestStart + costs.of(list.back());
      continue;
    }
    Action a = in.actions[r][next[r]++];
    const bool split = a.kind == ActionKind::Backward && a.stage > 0 && a.microbatch >= m - k;
    if (split) {
      a.kind = ActionKind::BackwardInput;
      postponed[r].push_back({ActionKind::BackwardWeight, a.stage, a.microbatch});
    }
    list.push_back(a);
    freeAt[r] = bestStart + costs.of(a);
    if (a.kind == ActionKind::Forward) fEnd[at(a.stage, a.microbatch)] = freeAt[r];
    else if (a.kind != ActionKind::BackwardWeight) gEnd[at(a.stage, a.microbatch)] = freeAt[r];
  }
  // A checked schedule always progresses: its order is kept, and a W waits only for its own I.
  for (size_t r = 0; r < next.size(); ++r)
    if (next[r] != in.actions[r].size())
      throw Error(fmt::format("splitTail: internal error: rank {} of '{}' stopped at action {}", r, in.name, next[r]));
  check(out);
  return out;
}

std::string formatTimeline(const Simulation& sim, double unit) {
  if (unit <= 0) {
    unit = std::numeric_limits<double>::infinity();
    for (const auto& row : sim.timeline)
      for (const auto& t : row)
        if (isCompute(t.action.kind) && t.end > t.start) unit = std::min(unit, t.end - t.start);
    if (!std::isfinite(unit)) unit = 1.0;
  }
  bool manyStages = false;
  size_t width = 2;
  for (const auto& row : sim.timeline)
    for (const auto& t : row) {
      if (t.action.stage >= static_cast<int>(sim.timeline.size())) manyStages = true;
    }
  for (const auto& row : sim.timeline)
    for (const auto& t : row)
      if (isCompute(t.action.kind)) width = std::max(width, t.action.shortStr(manyStages).size() + 1);
  const auto cells = static_cast<size_t>(std::ceil(sim.makespan / unit - 1e-9));
  std::string out;
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    std::string line(cells * width, ' ');
    for (size_t c = 0; c < cells; ++c) line[c * width] = '.';
    for (const auto& t : sim.timeline[r]) {
      if (!isCompute(t.action.kind)) continue;
      const auto from = static_cast<size_t>(std::llround(t.start / unit)) * width;
      const auto to = std::min(line.size(), static_cast<size_t>(std::llround(t.end / unit)) * width);
      if (to <= from) continue;
      std::fill(line.begin() + static_cast<std::ptrdiff_t>(from), line.begin() + static_cast<std::ptrdiff_t>(to), ' ');
      const std::string label = t.action.shortStr(manyStages);
      line.replace(from, std::min(label.size(), to - from), label.substr(0, to - from));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += fmt::format("rank {:>2} | {}\n", r, line);
  }
  return out;
}

std::string timelineSvg(const Simulation& sim, const std::string& title) {
  const double scale = sim.makespan > 0 ? 900.0 / sim.makespan : 1.0;
  const int rowH = 28, top = title.empty() ? 10 : 34, left = 70;
  const auto ranks = sim.timeline.size();
  std::string svg =
      fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
                  "font-size=\"11\">\n",
                  left + 920, top + static_cast<int>(ranks) * rowH + 10);
  if (!title.empty()) svg += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n", title);
  bool manyStages = false;
  for (const auto& row : sim.timeline)
    for (const auto& t : row)
      if (t.action.stage >= static_cast<int>(ranks)) manyStages = true;
  for (size_t r = 0; r < ranks; ++r) {
    const int y = top + static_cast<int>(r) * rowH;
    svg += fmt::format("<text x=\"8\" y=\"{}\">rank {}</text>\n", y + 18, r);
    for (const auto& t : sim.timeline[r]) {
      if (!isCompute(t.action.kind)) continue;
      const char* fill = t.action.kind == ActionKind::Forward         ? "#6fa8dc"
                         : t.action.kind == ActionKind::Backward      ? "#93c47d"
                         : t.action.kind == ActionKind::BackwardInput ? "#b6d7a8"
                                                                      : "#f6b26b";
      const double x = left + t.start * scale, w = std::max(1.0, (t.end - t.start) * scale);
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" stroke=\"#333\"/>"
                         "<text x=\"{:.1f}\" y=\"{}\">{}</text>\n",
                         x, y, w, rowH - 4, fill, x + 2, y + 16, t.action.shortStr(manyStages));
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace cohort::pipeline
