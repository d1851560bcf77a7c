// RoundState: admission, withdrawal, heartbeats, failures and leaving (the
// transitions of round_state.h). Closing a round and placing its ranks live in
// round_close.cpp. Holds no lock and reads no clock: the server does both.
#include "rendezvous/round_state.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "common/signal_name.h"
#include "rendezvous/hang_attribution.h"
#include "rendezvous/token.h"

namespace dtrain::rendezvous {
using detail::seconds_between;
using detail::seconds_text;

RoundState::RoundState(ServerOptions options) : options_(std::move(options)) {
  if (options_.min_nodes < 1) options_.min_nodes = 1;
  if (options_.max_nodes < options_.min_nodes) options_.max_nodes = options_.min_nodes;
}

Refusal RoundState::check_auth(const std::string& job, const std::string& token) const {
  if (!tokens_equal(options_.token, token))
    return {RefusalKind::permission,
            "wrong token: set DTRAIN_TOKEN (or cluster.rendezvous.token_file) to the job's token"};
  if (job != options_.job)
    return {RefusalKind::invalid, "wrong job: this agent runs job '" + job +
                                      "' but the rendezvous server serves job '" + options_.job +
                                      "'; point cluster.rendezvous.endpoint at the right server"};
  return {};
}

Refusal RoundState::check_join(const JoinInfo& info) const {
  const std::string r = std::to_string(round_);
  if (info.node_id.empty()) return {RefusalKind::invalid, "join without a node_id"};
  if (info.slots < 1)
    return {RefusalKind::invalid, "node " + info.node_id + " offers " +
                                      std::to_string(info.slots) + " slots; it needs at least 1"};
  if (!info.island_of_device.empty() &&
      static_cast<int>(info.island_of_device.size()) != info.slots)
    return {RefusalKind::invalid, "node " + info.node_id + " reports " +
                                      std::to_string(info.island_of_device.size()) +
                                      " NVLink island ids for " + std::to_string(info.slots) +
                                      " slots; they must match"};
  if (info.node_rank >= options_.max_nodes)
    return {RefusalKind::invalid, "node_rank " + std::to_string(info.node_rank) +
                                      " is out of range: the job has cluster.nodes = " +
                                      std::to_string(options_.max_nodes) + " (ranks 0.." +
                                      std::to_string(options_.max_nodes - 1) + ")"};
  scanned_ += 2;
  if (auto it = waiting_by_id_.find(info.node_id); it != waiting_by_id_.end())
    return {RefusalKind::exists, "duplicate node: node_id '" + info.node_id +
                                     "' already joined round " + r +
                                     "; every agent needs a unique node id"};
  if (auto it = waiting_by_rank_.find(info.node_rank);
      info.node_rank >= 0 && it != waiting_by_rank_.end()) {
    const Member& m = *it->second;
    return {RefusalKind::exists, "duplicate node rank: node_rank " +
                                     std::to_string(info.node_rank) + " is already taken by '" +
                                     m.info.node_id + "' (host " + m.info.host + ") in round " +
                                     r + "; give every agent a distinct --node-rank"};
  }
  return {};
}

Refusal RoundState::join(const JoinInfo& info, uint64_t ticket, TimePoint now,
                         TimePoint expiry) {
  if (Refusal refusal = check_join(info)) return refusal;
  // A node that decided to restart before the permanent report came (its
  // own rank failed on the consequence) learns here that the job is over.
  if (stopped_)
    return {RefusalKind::precondition, "the job stopped without a restart: " + failure_ +
                                           " (a configuration error, which a restart would repeat)"};
  if (!open_) {
    ++scanned_;
    if (active_by_id_.count(info.node_id)) {
      open_next_round("node '" + info.node_id + "' re-joined");
    } else if (static_cast<int>(active_.size()) >= options_.max_nodes) {
      return {RefusalKind::exhausted,
              "too many nodes: round " + std::to_string(round_) + " is full (max nodes = " +
                  std::to_string(options_.max_nodes) + ", all joined); node '" + info.node_id +
                  "' is one too many; raise cluster.nodes or stop this agent"};
    } else {
      open_next_round("node '" + info.node_id + "' joins (elastic scale-up)");
    }
  }
  Member m;
  m.ticket = ticket;
  m.info = info;
  m.info.token.clear();
  m.joined = now;
  m.expiry = expiry;
  m.last_beat = now;
  add_waiting(std::move(m));
  if (static_cast<int>(waiting_.size()) == options_.min_nodes) min_reached_ = now;
  return {};
}

void RoundState::withdraw(uint64_t ticket) {
  ++scanned_;
  if (auto it = waiting_by_ticket_.find(ticket); it != waiting_by_ticket_.end())
    erase_waiting(it->second);
}

void RoundState::add_waiting(Member m) {
  if (m.expiry != TimePoint::max()) deadlines_.emplace(m.expiry, m.ticket);
  auto it = waiting_.insert(waiting_.end(), std::move(m));
  waiting_by_ticket_[it->ticket] = it;
  waiting_by_id_[it->info.node_id] = it;
  if (it->info.node_rank >= 0) waiting_by_rank_[it->info.node_rank] = it;
}

void RoundState::erase_waiting(WaitingIt it) {
  waiting_by_ticket_.erase(it->ticket);
  waiting_by_id_.erase(it->info.node_id);
  if (it->info.node_rank >= 0) waiting_by_rank_.erase(it->info.node_rank);
  waiting_.erase(it);
}

void RoundState::clear_waiting() {
  waiting_.clear();
  waiting_by_ticket_.clear();
  waiting_by_id_.clear();
  waiting_by_rank_.clear();
  deadlines_ = {};
}

void RoundState::set_active(std::vector<Member> members) {
  active_ = std::move(members);
  active_by_id_.clear();
  for (size_t i = 0; i < active_.size(); ++i) active_by_id_[active_[i].info.node_id] = i;
}

void RoundState::open_next_round(const std::string& why) {
  ++round_;
  open_ = true;
  DTRAIN_INFO("rendezvous: round {} opens: {} (restart count {})", round_, why, restart_);
}

// The joiners whose deadline has passed, soonest first: popped off the
// deadline heap (entries of joiners that already left are skipped).
std::vector<JoinOutcome> RoundState::expire_joins(TimePoint now) {
  std::vector<JoinOutcome> out;
  const int need = elastic() ? options_.min_nodes : options_.max_nodes;
  while (!deadlines_.empty() && deadlines_.top().first <= now) {
    const uint64_t ticket = deadlines_.top().second;
    deadlines_.pop();
    ++scanned_;
    auto found = waiting_by_ticket_.find(ticket);
    if (found == waiting_by_ticket_.end()) continue;  // withdrew earlier
    const Member& m = *found->second;
    std::string msg = "rendezvous timed out after " +
                      seconds_text(seconds_between(m.joined, m.expiry)) + " s: joined " +
                      std::to_string(waiting_.size()) + " of " + std::to_string(need) +
                      " nodes" +
                      (elastic() ? " (elastic " + std::to_string(options_.min_nodes) + ":" +
                                       std::to_string(options_.max_nodes) + ")"
                                 : std::string()) +
                      " in round " + std::to_string(round_);
    DTRAIN_WARN("rendezvous: join of '{}' ({}): {}", m.info.node_id, m.info.host, msg);
    out.push_back({m.ticket, {RefusalKind::deadline, msg}, nullptr, 0});
    erase_waiting(found->second);
  }
  return out;
}

std::vector<JoinOutcome> RoundState::poll(TimePoint now) {
  std::vector<JoinOutcome> out = expire_joins(now);
  // While a round re-forms after a failure, a member that neither re-joined
  // nor beats is lost: most often the failure's cause (its workers' peers
  // failed on the broken connections first), so it is named as the cause.
  if (open_) {
    if (const std::string dead = take_dead(now); !dead.empty()) {
      failure_ = dead + (failure_.empty() ? "" : "\n  the failure it caused: " + failure_.substr(0, failure_.find('\n')));
      DTRAIN_ERROR("rendezvous: {}", failure_);
    }
  }
  if (open_ && ready_to_close(now)) {
    auto closed = close_round(now);
    out.insert(out.end(), closed.begin(), closed.end());
  }
  if (!open_) check_hang(now);
  if (!open_) {
    if (const std::string dead = take_dead(now); !dead.empty()) {
      failure_ = dead;
      DTRAIN_ERROR("rendezvous: {}", failure_);
      open_next_round(dead.substr(0, dead.find('\n')));
    }
  }
  return out;
}

// Members of active_ that missed 3 heartbeats (while a round re-forms: and
// have not re-joined) leave it; returns what is said of them ("": none).
std::string RoundState::take_dead(TimePoint now) {
  auto limit = std::chrono::duration<double>(3 * options_.heartbeat_s);
  auto dead = [&](const Member& m) {
    return now - m.last_beat > limit && !(open_ && waiting_by_id_.count(m.info.node_id));
  };
  scanned_ += active_.size();
  if (std::none_of(active_.begin(), active_.end(), dead)) return "";
  std::string names, lost;  // each lost node: rank, id, address, hostname, last heartbeat
  std::vector<Member> alive;
  for (Member& m : active_) {
    if (!dead(m)) {
      alive.push_back(std::move(m));
      continue;
    }
    names += (names.empty() ? "'" : ", '") + m.info.node_id + "'";
    lost += "\n  lost node " + std::to_string(m.info.node_rank) + ": id '" + m.info.node_id + "', address " +
            m.info.host + (m.info.hostname.empty() ? "" : ", hostname " + m.info.hostname) + ", last heartbeat " +
            seconds_text(seconds_between(m.last_beat, now)) + " s ago";
  }
  set_active(std::move(alive));
  return "node " + names + " missed 3 heartbeats (" + seconds_text(3 * options_.heartbeat_s) +
         " s) and is declared dead" + lost;
}

bool RoundState::ready_to_close(TimePoint now) const {
  int n = static_cast<int>(waiting_.size());
  if (n >= options_.max_nodes) return true;
  if (!elastic() || n < options_.min_nodes) return false;
  // A round re-formed after a loss: once every member of the last round that
  // is still alive has re-joined, nobody else is expected; no last call.
  // Checked only once enough have joined, by the node-id index: joins stay O(1).
  const bool survivors_back =
      !active_.empty() && n >= static_cast<int>(active_.size()) &&
      std::all_of(active_.begin(), active_.end(),
                  [&](const Member& a) { return waiting_by_id_.count(a.info.node_id) != 0; });
  return survivors_back || seconds_between(min_reached_, now) >= options_.last_call_s;
}

HeartbeatReply RoundState::heartbeat(const std::string& node_id, uint64_t round,
                                     TimePoint now, const std::vector<trace::RankProgress>& ranks) {
  HeartbeatReply reply;
  reply.current_round = round_;
  reply.failure = failure_;
  reply.known = false;
  if (!open_ && round == round_)
    for (const trace::RankProgress& p : ranks) {
      auto it = progress_.find(p.rank);
      if (it == progress_.end() || it->second.completed != p.completed) last_progress_ = now;
      if (it != progress_.end() && !p.waiting && p.cpu_ns > 0 && it->second.cpu_ns > 0) {
        const double wall_s = seconds_between(beat_at_[p.rank], now);
        if (double(p.cpu_ns - it->second.cpu_ns) * 1e-9 >= kComputingShare * wall_s && wall_s > 0)
          computing_at_[p.rank] = now;
      }
      beat_at_[p.rank] = now;
      progress_[p.rank] = p;
      progress_node_[p.rank] = node_id;
    }
  if (!all_started_ && last_closed_ && progress_.size() == last_closed_->placement.ranks.size() &&
      std::all_of(progress_.begin(), progress_.end(),
                  [](const auto& kv) { return kv.second.completed > 0; })) {
    all_started_ = true;
    last_progress_ = now;
  }
  scanned_ += 2;
  if (auto it = active_by_id_.find(node_id); it != active_by_id_.end()) {
    active_[it->second].last_beat = now;
    reply.known = true;
  }
  if (waiting_by_id_.count(node_id)) reply.known = true;
  return reply;
}

HeartbeatReply RoundState::news(const std::string& node_id) const {
  HeartbeatReply reply;
  reply.current_round = round_;
  reply.failure = failure_;
  reply.known = active_by_id_.count(node_id) > 0 || waiting_by_id_.count(node_id) > 0;
  return reply;
}

void RoundState::report_failure(const FailureReport& r) {
  std::string what = r.signal ? "signal " + std::to_string(r.signal) + " (" + signal_name(r.signal) + ")"
                              : "exit code " + std::to_string(r.exit_code);
  DTRAIN_WARN("rendezvous: node '{}' reports a failure in round {}: rank {} (local {}) {}{}{}",
              r.node_id, r.round, r.rank, r.local_rank, what, r.message.empty() ? "" : ": ",
              r.message);
  if (r.permanent) stopped_ = true;  // whatever round it names: a restart would repeat it
  const bool earlier = r.round == failure_round_ && !failure_.empty() && r.failed_at > 0 &&
                       r.failed_at < failure_at_;
  if ((r.round != round_ || open_) && !earlier) return;  // this round was already restarted
  std::string node = "'" + r.node_id + "'";  // with its rank, address and hostname when known
  for (const Member& m : active_)
    if (m.info.node_id == r.node_id)
      node = std::to_string(m.info.node_rank) + " (" + m.info.host +
             (m.info.hostname.empty() ? "" : ", hostname " + m.info.hostname) + ", id '" +
             r.node_id + "')";
  failure_ = "rank " + std::to_string(r.rank) + " (local rank " + std::to_string(r.local_rank) +
             ") on node " + node + " failed: " + what +
             (r.message.empty() ? "" : ": " + r.message);
  failure_round_ = r.round;
  failure_at_ = r.failed_at > 0 ? r.failed_at : 1e300;
  if (earlier) {
    DTRAIN_WARN("rendezvous: that failure came first in round {}; it is the root cause", r.round);
    return;
  }
  ++restart_;
  open_next_round("worker failure on node '" + r.node_id + "'");
}

void RoundState::leave(const std::string& node_id, bool success) {
  auto it = active_by_id_.find(node_id);
  if (it == active_by_id_.end()) return;
  std::vector<Member> rest = std::move(active_);
  rest.erase(rest.begin() + static_cast<long>(it->second));
  set_active(std::move(rest));
  DTRAIN_INFO("rendezvous: node '{}' left round {} ({})", node_id, round_,
              success ? "finished" : "failed");
  // A clean finish is not a membership change; a failed node is.
  if (!success && !open_) open_next_round("node '" + node_id + "' left after a failure");
}

ServerStatus RoundState::status(TimePoint now) const {
  ServerStatus s;
  s.failure = failure_;
  s.stopped = stopped_;
  s.job = options_.job;
  s.round = round_;
  s.restart = restart_;
  s.min_nodes = options_.min_nodes;
  s.max_nodes = options_.max_nodes;
  s.round_open = open_;
  auto add = [&](const Member& m) {
    s.nodes.push_back({m.info.node_id, m.info.host, m.info.node_rank,
                       seconds_between(m.last_beat, now), m.info.hostname, {}});
    for (const auto& [rank, p] : progress_)
      if (progress_node_.count(rank) && progress_node_.at(rank) == m.info.node_id) s.nodes.back().ranks.push_back(p);
  };
  if (open_)
    for (const Member& m : waiting_) add(m);
  else
    for (const Member& m : active_) add(m);
  return s;
}

}  // namespace dtrain::rendezvous
