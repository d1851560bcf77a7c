// The worker's side of recovery in place (cluster.recover_in_place): with
// DTRAIN_ROUND_CHANNEL set, stdin is a pipe from the agent, which writes the
// next round's whole environment down it ("K=V\0" ... "\0", as to a warm
// spare) instead of killing the worker on a round change. Not the training
// itself: main.cpp runs run_training() again with the new environment.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::worker {

// Set by the agent on workers whose stdin is their round channel.
inline constexpr const char* kRoundChannelEnv = "DTRAIN_ROUND_CHANNEL";
// How long a worker whose round failed waits for its agent's notice of a
// new round before the failure counts as its own (seconds).
inline constexpr const char* kRoundWaitEnv = "DTRAIN_ROUND_WAIT_S";

// Whether a failure of run_training() may be a round change's doing, worth
// waiting DTRAIN_ROUND_WAIT_S for the notice: a communication error (a
// dtrain::Error worker_failed, timeout or rendezvous, as the groups wrap
// Gloo's; c10's distributed errors), what a peer that died or a round the
// agent ended causes. Anything else (a config, checkpoint or internal
// error; an exception from the model, the data or a fault) is this rank's
// own: waiting would only hold its report, while its peers, whose
// collectives it broke, wait for a notice its report has to cause.
bool may_be_round_change(std::exception_ptr failure);

class RoundChannel {
 public:
  // A watcher thread on stdin when DTRAIN_ROUND_CHANNEL is set, else null.
  // The thread is detached: it blocks in read() until the process ends.
  static std::shared_ptr<RoundChannel> open_if_enabled();

  // The next round's environment, once the agent sent it: waits up to
  // timeout_s (0: only looks). nullopt when none came or stdin ended.
  // Taking one clears the engine's abort flag (engine/comm/round_abort.h).
  std::optional<std::vector<std::string>> next(double timeout_s);

 private:
  void watch();  // the watcher thread: reads messages, ends the round on each
  void end_round_with(std::vector<std::string> env);
  void wait_for_input_or_taken();

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::vector<std::string>> pending_;
  bool closed_ = false;
};

}  // namespace dtrain::worker
