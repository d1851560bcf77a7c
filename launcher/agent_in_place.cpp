// Recovery in place (cluster.recover_in_place): on a round change the
// agent keeps its live workers and sends each the next round's whole
// environment down its stdin pipe (the worker's round channel,
// apps/dtrain-worker/round_channel.h), as it hands a warm spare its rank.
// The worker ends its round itself (shuts its sockets) and trains again in
// the same process. Ranks with no live worker start as usual.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "launcher/agent.h"
#include "launcher/session_signal.h"

namespace dtrain::launcher {

bool Agent::in_place() const { return spec_.cluster.recover_in_place && spec_.builtin_entrypoint(); }

void Agent::end_round_handles() {
  if (heartbeat_) heartbeat_detail_ = heartbeat_->detail();
  if (heartbeat_) remote_failure_ = heartbeat_->failure();
  heartbeat_.reset();
  procs_.reset();
  if (int sig = relay_ ? relay_->take_stop_signal() : 0)
    if (stop_signal_ == 0) stop_signal_ = sig;
  relay_.reset();
}

bool Agent::round_ended_by_hang() const {
  return heartbeat_ && heartbeat_->failure().rfind("hang: ", 0) == 0;
}

void Agent::keep_step() {
  if (procs_) kept_ = procs_->release();
  size_t live = 0;
  for (auto& p : kept_) live += p && !p->try_reap() ? 1 : 0;
  DTRAIN_INFO("keeping {} worker(s) for the next round (cluster.recover_in_place): they leave this "
              "round when they get its environment", live);
  for (auto& w : group_.workers) w.state = WorkerState::STOPPED;
  end_round_handles();
  group_.state = WorkerState::STOPPED;
}

std::unique_ptr<Process> Agent::take_kept(size_t slot, const WorkerSpec& spec) {
  if (slot >= kept_.size() || !kept_[slot]) return nullptr;
  std::unique_ptr<Process> p = std::move(kept_[slot]);
  const std::string payload = spare_payload(spec.env);
  std::string why;
  if (p->try_reap())
    why = "it exited meanwhile";
  else if (p->channel_fd() < 0)
    why = "it has no round channel";
  else {
    // Fits the pipe's buffer (checked like a spare's): the write never waits.
    size_t done = 0;
    while (done < payload.size()) {
      ssize_t n = ::write(p->channel_fd(), payload.data() + done, payload.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += size_t(n);
    }
    if (done < payload.size()) why = std::string("writing its environment failed: ") + std::strerror(errno);
  }
  if (why.empty()) return p;
  DTRAIN_WARN("local rank {} (pid {}) does not continue in place: {}; starting a new process", slot, p->pid(), why);
  const pid_t pid = p->pid();
  p.reset();  // SIGKILLs its group and reaps it
  if (watch_) watch_->forget(pid);
  remove_shm_segments_of(pid);
  return nullptr;
}

void Agent::discard_kept() {
  for (auto& p : kept_) {
    if (!p) continue;
    const pid_t pid = p->pid();
    p.reset();
    if (watch_) watch_->forget(pid);
    remove_shm_segments_of(pid);
  }
  kept_.clear();
}

}  // namespace dtrain::launcher
