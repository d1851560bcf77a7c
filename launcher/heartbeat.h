// The agent's heartbeat thread for one round: beats every interval, and
// turns what it learns into a verdict the monitor loop reads (the round
// moved on, or the rendezvous is unreachable). Each beat waits at the server
// for up to an interval, so a new round is heard of when the rendezvous
// declares it, not at the next beat. It never touches workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/rendezvous_client.h"

namespace dtrain::launcher {

class Heartbeat {
 public:
  enum class Verdict { ok, round_changed, unreachable };
  static constexpr int kMaxMisses = 3;  // consecutive failed beats = unreachable

  // wake() is called (from the heartbeat thread) when the verdict changes;
  // progress() (may be empty) gives this node's ranks' collective progress,
  // sent with every beat.
  using Progress = std::function<std::vector<trace::RankProgress>()>;
  Heartbeat(rendezvous::RendezvousClient& client, std::string node_id, uint64_t round,
            double interval_s, std::function<void()> wake, Progress progress = {});
  ~Heartbeat();  // cancels the beat in flight, joins the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  Verdict verdict() const { return verdict_.load(); }
  // Why (the last error, or the round numbers); valid once verdict() != ok.
  std::string detail() const;
  // The rendezvous' account of why the round failed ("" = none given).
  std::string failure() const;

 private:
  void run();
  bool beat();  // false once the rendezvous is unreachable (a round change: beats on)

  rendezvous::RendezvousClient& client_;
  std::string node_id_;
  uint64_t round_;
  double interval_s_;
  std::function<void()> wake_;
  Progress progress_;
  std::atomic<Verdict> verdict_{Verdict::ok};
  int misses_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string detail_;
  std::string failure_;
  rendezvous::CallCancel cancel_;  // ends the waiting beat when stopping
  std::thread thread_;
};

}  // namespace dtrain::launcher
