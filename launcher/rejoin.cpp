// The agent's way back after losing the rendezvous (agent.h): its workers are
// already stopped; it keeps joining until cluster.rendezvous.rejoin_timeout_s
// has passed, and is admitted at the next round once its link returns (the
// rendezvous treats it as a node that re-joined or joins).
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

void Agent::begin_rejoin() {
  const double limit = spec_.cluster.rendezvous.rejoin_timeout_s;
  const std::string lost = "lost the rendezvous server at " + config_.endpoint + ": " + heartbeat_detail_;
  if (limit <= 0)
    throw Error(ErrorCode::rendezvous, lost + " (cluster.rendezvous.rejoin_timeout_s is 0: not re-joining)",
                "check that the rendezvous (node 0 or `dtrain rendezvous`) is still running, or set "
                "cluster.rendezvous.rejoin_timeout_s so that this node re-joins when its link returns");
  rejoin_lost_ = lost;
  rejoin_since_ = Clock::now();
  rejoining_ = true;
  DTRAIN_WARN("{}; stopped this node's workers, re-joining for up to {:g} s "
              "(cluster.rendezvous.rejoin_timeout_s)",
              lost, limit);
}

rendezvous::Assignment Agent::rejoin(const rendezvous::JoinInfo& info) {
  const double limit = spec_.cluster.rendezvous.rejoin_timeout_s;
  const double poll_s = std::clamp(spec_.cluster.rendezvous.heartbeat_s, 0.1, 1.0);
  std::string last;
  for (int attempt = 1;; ++attempt) {
    const double left = limit - seconds_since(rejoin_since_);
    if (left <= 0) break;
    // Each attempt on a new connection (RendezvousClient::reconnect: the one
    // that lived through the partition holds the server's replies back for
    // seconds), and only once it is up: a connection attempt made while the
    // link is down waits for the kernel's next SYN (1 s, 3 s, 7 s, ...), so
    // a fresh one is opened every poll_s until one succeeds.
    client_.reconnect();
    if (!client_.wait_connected(std::min(poll_s, left))) {
      last = "no connection to " + config_.endpoint + " within " + fmt::format("{:g}", poll_s) + " s";
      if (attempt == 1 || attempt % 10 == 0)
        DTRAIN_WARN("re-join attempt {} failed ({:.1f} s of {:g} s used): {}", attempt,
                    seconds_since(rejoin_since_), limit, last);
      continue;
    }
    // One attempt waits at most join_timeout_s (less near the end): a join
    // that reaches the server returns as soon as the round closes.
    const double wait = std::max(1.0, std::min<double>(spec_.cluster.rendezvous.join_timeout_s, left));
    try {
      rendezvous::Assignment a = client_.join(info, wait);
      rejoining_ = false;
      DTRAIN_INFO("re-joined the rendezvous {:.1f} s after losing it (attempt {}): round {}, node {} of {}",
                  seconds_since(rejoin_since_), attempt, a.round, a.node_rank, a.num_nodes);
      // The others may have trained on without this node: from a restore
      // of an older step, on a smaller world. Its in-memory copies are then
      // another timeline's, and one of them can be complete and newer than
      // theirs (a copy this node finished receiving as the link went), which
      // a restore would take by its step number. They go: the nodes that
      // stayed hold the copies the next restore needs (or disk does).
      if (memory_)
        if (const int n = memory_->clear(); n > 0)
          DTRAIN_INFO("dropped this node's in-memory copies ({} entries in {}): they predate the cut, and the "
                      "others may have trained on without this node; the next restore uses the others' copies "
                      "or disk", n, memory_->dir());
      return a;
    } catch (const Error& e) {
      // The server answered something else (a refusal, a round that timed
      // out): that is no partition, and retrying would not change it.
      if (server_answers()) throw;
      last = e.message();
      DTRAIN_WARN("re-join attempt {} failed ({:.1f} s of {:g} s used): {}", attempt,
                  seconds_since(rejoin_since_), limit, last);
    }
    // A link that is down fails a join at once: do not spin on it.
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
  rejoining_ = false;
  throw Error(ErrorCode::rendezvous,
              rejoin_lost_ + "; gave up re-joining after " + fmt::format("{:.1f}", seconds_since(rejoin_since_)) +
                  " s (cluster.rendezvous.rejoin_timeout_s = " + fmt::format("{:g}", limit) +
                  ")" + (last.empty() ? "" : "; last attempt: " + last),
              "check the network between this node and the rendezvous, or raise "
              "cluster.rendezvous.rejoin_timeout_s");
}

bool Agent::server_answers() {
  try {
    client_.status();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace dtrain::launcher
