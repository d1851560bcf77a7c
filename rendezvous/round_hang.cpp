// RoundState's checks of a closed round's progress (round_state.h): a
// stalled collective, and a start-up that never reaches a first collective.
// Both are handled as a worker failure: named, a restart counted, the next
// round opened. Progress comes with the agents' heartbeats.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "rendezvous/hang_attribution.h"
#include "rendezvous/round_state.h"

namespace dtrain::rendezvous {

using detail::seconds_between;
using detail::seconds_text;

// The stall that makes a hang: hang_timeout_s, or with hang_timeout_steps
// that many of the slowest rank's last step (a hang is named in a few steps,
// not a fixed bound sized for the slowest job). Step-relative only once every
// rank has timed a step in its process and while none is saving (a
// synchronous save, or the wait behind one, may take several steps); never
// under four heartbeats nor over hang_timeout_s. Four: one more than the
// three missed beats that name a lost node, so a cut link or a dead agent
// (whose peers wait in a collective too) is named as that, not as a hang;
// and progress only arrives with the beats.
// `name` says which bound it was, for the report.
static double hang_bound(const ServerOptions& o, const std::map<int, trace::RankProgress>& progress,
                         std::string* name) {
  *name = "cluster.hang_timeout_s";
  if (o.hang_timeout_steps <= 0) return o.hang_timeout_s;
  int64_t slowest_ns = 0;
  for (const auto& [rank, p] : progress) {
    if (p.last_step_ns <= 0 || p.done_step <= p.start_step || p.phase == "checkpoint") return o.hang_timeout_s;
    slowest_ns = std::max(slowest_ns, p.last_step_ns);
  }
  const double step_s = double(slowest_ns) * 1e-9;
  const double bound = std::max(o.hang_timeout_steps * step_s, 4 * o.heartbeat_s);
  if (progress.empty() || bound >= o.hang_timeout_s) return o.hang_timeout_s;
  *name = "cluster.hang_timeout_steps " + detail::seconds_text(o.hang_timeout_steps) + " x the slowest step " +
          std::to_string(int(step_s * 1e3)) + " ms, at least 4 heartbeats";
  return bound;
}

// The closed round hangs when some rank waits in a collective and no rank
// completed one for the bound above: named, then handled as a worker failure
// (a restart while max_restarts allow, else every agent gives up).
void RoundState::check_hang(TimePoint now) {
  if (options_.hang_timeout_s <= 0 || !last_closed_) return;
  if (!all_started_) return check_startup(now);
  const double stalled = seconds_between(last_progress_, now);
  std::string bound_name;
  double bound = hang_bound(options_, progress_, &bound_name);
  if (stalled < bound) return;
  // The step-relative bound is for ranks that stopped: one still computing
  // outside a collective (CPU time growing, seen in the last 2.5 beats) is
  // slow, a straggler, and gets the whole hang_timeout_s. Once it stops
  // computing too, the stall counts from the last completed collective.
  if (bound < options_.hang_timeout_s) {
    std::string computing;
    for (const auto& [rank, at] : computing_at_) {
      auto p = progress_.find(rank);
      if (p != progress_.end() && !p->second.waiting && seconds_between(at, now) <= 2.5 * options_.heartbeat_s)
        computing += (computing.empty() ? "" : ",") + std::to_string(rank);
    }
    if (!computing.empty()) {
      bound = options_.hang_timeout_s;
      if (stalled < bound) return;
      bound_name = "rank(s) " + computing + " still computing, so not " + bound_name + ", but cluster.hang_timeout_s";
    }
  }
  bool waiting = std::any_of(progress_.begin(), progress_.end(),
                             [](const auto& kv) { return kv.second.waiting; });
  if (!waiting) return;
  std::map<int, const Member*> by_node;
  for (const Member& m : active_) by_node[m.info.node_rank] = &m;
  std::map<int, RankWhere> where;
  for (const RankPlacement& r : last_closed_->placement.ranks)
    if (auto it = by_node.find(r.node); it != by_node.end())
      where[r.rank] = {r.node, it->second->info.host, it->second->info.hostname};
  declare_hang(attribute_hang(last_closed_->placement.mesh, progress_, where, stalled, bound, bound_name).text);
}

// A rank stopped (or stuck) before its first collective never reports
// progress, so the stall above cannot see it: past startup_timeout_s since
// the round closed, the ranks that completed no collective are named. Only
// once some rank reported progress: an entrypoint other than the builtin
// engine writes no collective trace, and must not be taken for a hang.
void RoundState::check_startup(TimePoint now) {
  const double since = seconds_between(closed_at_, now);
  if (options_.startup_timeout_s <= 0 || since < options_.startup_timeout_s || progress_.empty()) return;
  std::map<int, const Member*> by_node;
  for (const Member& m : active_) by_node[m.info.node_rank] = &m;
  // Named: the ranks that never reported (a worker's trace exists from
  // before its groups connect; the others wait for these); when every rank
  // reported, those that completed no collective.
  std::vector<int> absent, waiting;
  for (const RankPlacement& r : last_closed_->placement.ranks) {
    auto p = progress_.find(r.rank);
    if (p == progress_.end()) absent.push_back(r.rank);
    else if (p->second.completed == 0) waiting.push_back(r.rank);
  }
  if (absent.empty()) absent.swap(waiting);
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int r : v) out += (out.empty() ? "" : ",") + std::to_string(r);
    return out;
  };
  std::string lines;
  for (const RankPlacement& r : last_closed_->placement.ranks) {
    if (std::find(absent.begin(), absent.end(), r.rank) == absent.end()) continue;
    auto p = progress_.find(r.rank);
    auto m = by_node.find(r.node);
    lines += "\n  rank " + std::to_string(r.rank) + " on node " + std::to_string(r.node) +
             (m == by_node.end() ? "" : " (" + m->second->info.host +
                                            (m->second->info.hostname.empty() ? "" : ", " + m->second->info.hostname) + ")") +
             (p == progress_.end() ? ": no progress reported (stopped or stuck before connecting)"
                                   : ": entered " + std::to_string(p->second.entered) + " collective(s), phase " +
                                         (p->second.phase.empty() ? "start-up" : p->second.phase));
  }
  if (!waiting.empty()) lines += "\n  rank(s) " + list(waiting) + " completed no collective either (they wait for it)";
  const std::string named = "rank(s) " + list(absent) + " completed no collective";
  declare_hang("hang: " + named + " in the " + seconds_text(since) + " s since round " + std::to_string(round_) +
               " closed (start-up is bounded by " + seconds_text(options_.startup_timeout_s) +
               " s: cluster.rendezvous.join_timeout_s, at least cluster.hang_timeout_s)" + lines);
}

void RoundState::declare_hang(const std::string& text) {
  DTRAIN_ERROR("rendezvous: {}", text);
  failure_ = text;
  ++restart_;
  open_next_round("hang in round " + std::to_string(round_));
}

}  // namespace dtrain::rendezvous
