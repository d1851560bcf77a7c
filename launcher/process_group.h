// This node's worker processes of one round: spawns them, pumps their
// output into RankOutputs, reaps them, and stops them (close(): a signal,
// a grace period, then SIGKILL). The one owner of worker processes; it
// keeps no worker states (the agent does, in WorkerGroup).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "launcher/process.h"
#include "launcher/rank_output.h"
#include "launcher/worker.h"
#include "launcher/worker_watch.h"

namespace dtrain::launcher {

struct ExitEvent {
  size_t index = 0;  // in spawn order (= local rank)
  ExitStatus status;
  std::chrono::system_clock::time_point when;
};

class ProcessGroup {
 public:
  // wake_fd: also polled (the SignalRelay's pipe), so signals interrupt waits.
  // watch: told each worker session (null: none), so the workers do not
  // outlive a killed agent.
  explicit ProcessGroup(int wake_fd, WorkerWatch* watch = nullptr);
  // Whatever still runs is SIGKILLed and reaped.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Spawn one more worker; its log is appended to, after the line
  // log_header. Throws like Process.
  // channel: its stdin is a pipe whose write end the Process keeps
  // (Process::channel_fd, recovery in place).
  pid_t spawn(int rank, const WorkerSpec& spec, const std::string& log_header, bool channel = false);
  // The same for a process already started (a warm spare given its rank).
  pid_t adopt(int rank, const WorkerSpec& spec, const std::string& log_header,
              std::unique_ptr<Process> process);

  // Wait up to timeout_s for output, exits or a wake-up; pump output; reap.
  std::vector<ExitEvent> poll(double timeout_s);

  size_t running() const;

  // Hands the processes back, by index, still running (recovery in place:
  // the next round's group adopts them); their output so far is written.
  std::vector<std::unique_ptr<Process>> release();

  // Send first_signal to every group, keep pumping and reaping for grace_s
  // (or until hurry() says so), then SIGKILL what is left of the workers'
  // sessions (also processes they moved to other groups) and reap it.
  // Returns the exits seen meanwhile. Returns only when no worker is left.
  std::vector<ExitEvent> close(int first_signal, double grace_s,
                               const std::function<bool()>& hurry);

 private:
  struct Entry {
    std::unique_ptr<Process> process;
    std::unique_ptr<RankOutput> output;
  };
  pid_t add(std::unique_ptr<RankOutput> output, std::unique_ptr<Process> process);
  void pump(size_t index);
  void reap(std::vector<ExitEvent>* events);

  std::vector<pid_t> sessions() const;  // every worker's session id (= its pid)
  void kill_sessions();                 // SIGKILL every process of them, then forget them

  int wake_fd_;
  WorkerWatch* watch_;
  std::vector<Entry> entries_;
};

}  // namespace dtrain::launcher
