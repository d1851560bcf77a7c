// RoundChannel (see round_channel.h). The watcher ends the round itself,
// from its own thread: the training thread may be blocked in a collective
// that only a closed socket interrupts.
#include "apps/dtrain-worker/round_channel.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <c10/util/Exception.h>

#include "common/error.h"
#include "engine/comm/round_abort.h"

namespace dtrain::worker {

bool may_be_round_change(std::exception_ptr failure) {
  if (!failure) return false;
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    return e.code() == ErrorCode::worker_failed || e.code() == ErrorCode::timeout ||
           e.code() == ErrorCode::rendezvous;
  } catch (const c10::DistError&) {
    return true;
  } catch (...) {
    return false;
  }
}

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
    // While a notice waits to be taken, the old round's sockets are shut
    // again every 50 ms, and a newer notice read meanwhile replaces it: two
    // round changes in quick succession (a node lost, then one joining) give
    // the worker the newest round, not the one its agent has moved past
    // (whose spec file the agent has already overwritten).
    wait_for_input_or_taken();
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
      end_round_with(std::move(env));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

// The old round ends (flag and sockets) before its successor can be taken,
// under the lock next() takes it under: the training thread never starts
// the new round with the old one's shutdown still to come (which would cut
// the new round's connections). A notice not yet taken is replaced.
void RoundChannel::end_round_with(std::vector<std::string> env) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool replaced = pending_.has_value();
  pending_ = std::move(env);
  engine::comm::abort_round();
  int shut = engine::comm::end_round();
  std::fprintf(stderr, "dtrain-worker: pid %d: the agent announced a new round%s; %d socket(s) shut down\n",
               static_cast<int>(::getpid()), replaced ? " (replacing one not yet taken)" : "", shut);
  cv_.notify_all();
}

// Returns when stdin has data to read (or read() has an error to report).
// While a notice waits to be taken, it
// wakes every 50 ms to shut the old round's sockets again (quietly): a
// training thread setting up the old round may open new ones after a scan,
// and would wait on them for its store's timeout.
void RoundChannel::wait_for_input_or_taken() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pending_) return;  // nothing to take: block in read()
      engine::comm::end_round();
    }
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int r = ::poll(&p, 1, 50);
    if (r > 0 || (r < 0 && errno != EINTR)) return;  // data, or an error read() reports
  }
}

std::optional<std::vector<std::string>> RoundChannel::next(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return pending_ || closed_; });
  auto out = std::move(pending_);
  pending_.reset();
  if (out) engine::comm::clear_round_abort();  // the next round starts clean
  if (out) cv_.notify_all();                    // the watcher stops shutting sockets
  return out;
}

}  // namespace dtrain::worker
