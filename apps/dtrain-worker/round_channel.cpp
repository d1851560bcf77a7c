// RoundChannel (see round_channel.h). The watcher ends the round itself,
// from its own thread: the training thread may be blocked in a collective
// that only a closed socket interrupts.
#include "apps/dtrain-worker/round_channel.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/comm/round_abort.h"

namespace dtrain::worker {

std::shared_ptr<RoundChannel> RoundChannel::open_if_enabled() {
  const char* on = std::getenv(kRoundChannelEnv);
  if (!on || !*on) return nullptr;
  auto channel = std::shared_ptr<RoundChannel>(new RoundChannel());
  std::thread([channel] { channel->watch(); }).detach();
  return channel;
}

void RoundChannel::watch() {
  std::string got;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    // A message ends with an empty entry: "\0\0" (entries are never empty).
    for (size_t end = got.find(std::string(2, '\0')); end != std::string::npos;
         end = got.find(std::string(2, '\0'))) {
      std::vector<std::string> env;
      for (size_t from = 0; from < end + 1;) {
        size_t stop = got.find('\0', from);
        env.push_back(got.substr(from, stop - from));
        from = stop + 1;
      }
      got.erase(0, end + 2);
      {
        // The flag with the message, under the lock next() clears it under:
        // a notice is never taken with its abort still to come.
        std::lock_guard<std::mutex> lock(mu_);
        pending_ = std::move(env);
        engine::comm::abort_round();
      }
      const int shut = engine::comm::end_round();  // the training thread may be blocked on a socket
      std::fprintf(stderr, "dtrain-worker: pid %d: the agent announced a new round; %d socket(s) shut down\n",
                   static_cast<int>(::getpid()), shut);
      cv_.notify_all();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

std::optional<std::vector<std::string>> RoundChannel::next(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return pending_ || closed_; });
  auto out = std::move(pending_);
  pending_.reset();
  if (out) engine::comm::clear_round_abort();  // the next round starts clean
  return out;
}

}  // namespace dtrain::worker
