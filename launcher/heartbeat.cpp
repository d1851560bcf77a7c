// Heartbeat (see heartbeat.h).
#include "launcher/heartbeat.h"

#include "common/error.h"
#include "common/log.h"

namespace dtrain::launcher {

Heartbeat::Heartbeat(rendezvous::RendezvousClient& client, std::string node_id, uint64_t round,
                     double interval_s, std::function<void()> wake, Progress progress)
    : client_(client),
      node_id_(std::move(node_id)),
      round_(round),
      interval_s_(interval_s),
      wake_(std::move(wake)),
      progress_(std::move(progress)) {
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  cancel_.cancel();
  thread_.join();
}

std::string Heartbeat::detail() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return detail_;
}

std::string Heartbeat::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

// The server holds each beat up to interval_s (answering early when the
// round moves on); one that comes back sooner without news (a failed call,
// a server that does not hold) waits out the rest: never more than one beat
// an interval.
void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(interval_s_));
    lock.unlock();
    bool more = beat();
    lock.lock();
    if (!more) break;
    cv_.wait_until(lock, next, [this] { return stopping_; });
  }
}

bool Heartbeat::beat() {
  // Once the round moved on, the agent stops its workers (SIGTERM, SIGKILL
  // after grace_s) before it re-joins, which may take longer than the 3
  // heartbeats after which the rendezvous declares a node dead: beat on
  // (the verdict stays) until the agent stops this thread.
  if (verdict_.load() == Verdict::round_changed) {
    try {
      client_.heartbeat(node_id_, round_, {});
    } catch (const Error&) {
    }
    return true;
  }
  std::string why;
  Verdict verdict = Verdict::ok;
  std::string failure;
  try {
    // Held at the server for up to an interval: the answer comes the moment
    // the round moves on. It can come before the agent reaped its own worker
    // that failed first; the agent reaps and reports such a worker before it
    // acts on the change (Agent::after_round_change_notice).
    std::optional<rendezvous::HeartbeatReply> answer = client_.wait_heartbeat(
        node_id_, round_, progress_ ? progress_() : std::vector<trace::RankProgress>{}, interval_s_, cancel_);
    if (!answer) return true;  // cancelled: stopping
    const rendezvous::HeartbeatReply& reply = *answer;
    failure = reply.failure;
    misses_ = 0;
    if (!reply.known) {
      verdict = Verdict::round_changed;
      why = "the rendezvous dropped this node from round " + std::to_string(round_);
    } else if (reply.current_round != round_) {
      verdict = Verdict::round_changed;
      why = "round " + std::to_string(round_) + " -> " + std::to_string(reply.current_round);
    }
  } catch (const Error& e) {
    ++misses_;
    DTRAIN_WARN("heartbeat {} of {} failed: {}", misses_, kMaxMisses, e.message());
    if (misses_ >= kMaxMisses) {
      verdict = Verdict::unreachable;
      why = std::to_string(misses_) + " heartbeats in a row failed (every " +
            fmt::format("{:g}", interval_s_) + " s); last: " + e.message();
    }
  }
  if (verdict == Verdict::ok) return true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    detail_ = why;
    failure_ = failure;
  }
  verdict_.store(verdict);
  wake_();
  return verdict == Verdict::round_changed;
}

}  // namespace dtrain::launcher
