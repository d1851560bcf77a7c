// The rendezvous round state machine: who waits, when a round closes, who is
// dead, what each joiner is told. Pure (no gRPC, no threads, no clock: the
// caller passes `now` and holds the lock), so it is unit-tested without
// sockets. The server (rendezvous_server.cpp) only moves messages in and out.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/rendezvous_server.h"
#include "rendezvous/rendezvous_types.h"

namespace dtrain::rendezvous {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

namespace detail {
// "5" or "1.5": seconds as messages print them.
inline std::string seconds_text(double s) {
  char buf[32];
  if (std::fabs(s - std::round(s)) < 1e-6)
    std::snprintf(buf, sizeof buf, "%.0f", s);
  else
    std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}
inline double seconds_between(TimePoint a, TimePoint b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace detail

// Why a call was refused; maps 1:1 onto a gRPC status code in the server.
enum class RefusalKind { none, permission, invalid, exists, exhausted, precondition, deadline };

struct Refusal {
  RefusalKind kind = RefusalKind::none;
  std::string message;
  explicit operator bool() const { return kind != RefusalKind::none; }
};

// What every member of a closed round shares (built once per round).
struct ClosedRound {
  uint64_t round = 0;
  int restart = 0;
  Placement placement;
  std::vector<std::string> node_ids;  // by node rank
  std::string master_addr;
  int master_port = 0;
};

// The answer to one waiting Join (ticket = the server's handle on the call).
struct JoinOutcome {
  uint64_t ticket = 0;
  Refusal refusal;                           // set: refused (timeout, bad placement)
  std::shared_ptr<const ClosedRound> closed; // set: the round closed with it in it
  int node_rank = 0;
};

// A round's members (or the waiting list of an open round).
struct Member {
  uint64_t ticket = 0;
  JoinInfo info;  // token cleared
  TimePoint joined{};
  TimePoint expiry = TimePoint::max();
  TimePoint last_beat{};
};

class RoundState {
 public:
  explicit RoundState(ServerOptions options);

  // Token (constant time) then job name. Every call goes through this first.
  Refusal check_auth(const std::string& job, const std::string& token) const;
  // Admit a joiner to the open round (opening the next one when needed) or
  // refuse it. Call poll() afterwards: the join may have filled the round.
  // Tickets are unique (the server counts them). O(1) amortised, like
  // withdraw, heartbeat and a poll that decides nothing.
  Refusal join(const JoinInfo& info, uint64_t ticket, TimePoint now, TimePoint expiry);
  // A waiting joiner went away (cancelled, deadline): it leaves the round.
  void withdraw(uint64_t ticket);
  // Time-driven transitions: expired joins, last call, heartbeat deaths.
  // Returns the answers for waiting joiners that are now decided.
  std::vector<JoinOutcome> poll(TimePoint now);

  // ranks: the collective progress of the node's ranks (may be empty).
  HeartbeatReply heartbeat(const std::string& node_id, uint64_t round, TimePoint now,
                           const std::vector<trace::RankProgress>& ranks = {});
  // What heartbeat() would answer now, recording no beat: the late reply of
  // a beat the server held. O(1).
  HeartbeatReply news(const std::string& node_id) const;
  void report_failure(const FailureReport& report);
  void leave(const std::string& node_id, bool success);
  ServerStatus status(TimePoint now) const;

  uint64_t round() const { return round_; }
  const std::string& job() const { return options_.job; }
  // The last round that closed (its whole placement), null before the first.
  std::shared_ptr<const ClosedRound> last_closed() const { return last_closed_; }
  bool open() const { return open_; }
  // Entries that join, withdraw, heartbeat and poll have examined so far
  // (index look-ups, deadline pops, list visits; closing a round is not
  // counted): a test's measure that joins stay O(1) amortised, untimed.
  uint64_t scanned() const { return scanned_; }

 private:
  bool elastic() const { return options_.min_nodes < options_.max_nodes; }
  Refusal check_join(const JoinInfo& info) const;
  void open_next_round(const std::string& why);
  bool ready_to_close(TimePoint now) const;
  std::vector<JoinOutcome> close_round(TimePoint now);
  std::vector<Member> ordered_waiting() const;
  mesh::Mesh mesh_for(const Cluster& cluster) const;
  mesh::Mesh checked_global_batch(const mesh::Mesh& mesh) const;
  Cluster cluster_of(const std::vector<Member>& members) const;
  void log_summary(const ClosedRound& closed, const std::vector<Member>& members);
  std::string take_dead(TimePoint now);  // poll(): members that stopped beating leave active_
  void check_hang(TimePoint now);  // poll(): a stalled closed round is a failure (round_hang.cpp)
  void check_startup(TimePoint now);  // ... and so is a rank that never started
  void declare_hang(const std::string& text);  // names it, counts a restart, opens the next round
  // The waiting list and its indexes change only through these.
  void add_waiting(Member m);
  void erase_waiting(std::list<Member>::iterator it);
  void clear_waiting();
  void set_active(std::vector<Member> members);  // active_ and its index
  std::vector<JoinOutcome> expire_joins(TimePoint now);

  // Collective progress of the closed round's ranks (heartbeats), and when
  // any rank last completed one.
  std::map<int, trace::RankProgress> progress_;
  std::map<int, std::string> progress_node_;  // the node id whose heartbeat carried each rank
  std::map<int, TimePoint> beat_at_;      // when each rank's progress last arrived
  // When each rank was last seen computing: outside a collective, its CPU
  // time grew by >= kComputingShare of the wall time between two beats. A
  // slow rank keeps others waiting as a stopped one does; only this tells
  // them apart (round_hang.cpp).
  std::map<int, TimePoint> computing_at_;
  static constexpr double kComputingShare = 0.02;
  TimePoint last_progress_{};
  // Every rank has completed a collective: start-up (loading LibTorch, a
  // slow rank's set-up) is never taken for a hang; it has a bound of its
  // own (startup_timeout_s from when the round closed).
  bool all_started_ = false;
  TimePoint closed_at_{};
  std::string failure_;  // why the last failed round ended
  // The worker failure failure_ reports: its round and time. A later report
  // of the same round with an earlier time replaces it (a peer that broke on
  // the first failure often reports first).
  uint64_t failure_round_ = 0;
  double failure_at_ = 0;
  bool stopped_ = false;  // a permanent failure was reported (FailureReport::permanent)

  ServerOptions options_;
  uint64_t round_ = 1;
  int restart_ = 0;
  bool open_ = true;
  std::list<Member> waiting_;    // joiners of the open round, in join order
  // waiting_ by ticket, node id and requested node rank: a join checks for
  // duplicates, and a withdrawal or heartbeat finds its joiner, in O(1).
  using WaitingIt = std::list<Member>::iterator;
  std::unordered_map<uint64_t, WaitingIt> waiting_by_ticket_;
  std::unordered_map<std::string, WaitingIt> waiting_by_id_;
  std::unordered_map<int, WaitingIt> waiting_by_rank_;
  // Waiting joiners' deadlines, soonest on top. Lazy deletion: a joiner that
  // withdrew leaves its entry, skipped when it surfaces (each entry is
  // popped once: O(1) amortised per join); emptied when the round closes.
  using Deadline = std::pair<TimePoint, uint64_t>;  // expiry, ticket
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
  std::vector<Member> active_;   // members of the last closed round, by node rank
  std::unordered_map<std::string, size_t> active_by_id_;  // node id -> index in active_
  TimePoint min_reached_{};      // elastic: when waiting_ reached min_nodes
  std::shared_ptr<const ClosedRound> last_closed_;
  mutable uint64_t scanned_ = 0;  // see scanned()
};

}  // namespace dtrain::rendezvous
