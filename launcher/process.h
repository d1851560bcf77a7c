// One worker process: spawned with posix_spawn (the agent has gRPC threads,
// so no fork without exec) in its own process group, stdout+stderr into one
// pipe that the agent reads. Knows nothing of ranks, rounds or logs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "launcher/exit_status.h"
#include "launcher/worker.h"

namespace dtrain::launcher {

// /proc/<pid>/stat after the command name (which is in parentheses and may
// hold spaces or ')'): " <state> <ppid> <pgrp> <session> ..."; "" when it is gone.
std::string proc_stat_fields(pid_t pid);

// CPU time (user + system) `pid` has used, in ns, from /proc/<pid>/stat
// (clock-tick resolution); 0 when it is gone.
int64_t process_cpu_ns(pid_t pid);

class Process {
 public:
  // Spawns spec.argv with spec.env. Throws dtrain::Error(config) when the
  // program cannot be started (not found, not executable). stdin_fd >= 0
  // becomes its stdin (a warm spare's pipe, warm_spares.h); else /dev/null.
  explicit Process(const WorkerSpec& spec, int stdin_fd = -1);
  // A process still running is SIGKILLed (its whole group) and reaped.
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // Read end of the output pipe (non-blocking); -1 once it reached EOF.
  int output_fd() const { return out_fd_; }
  // Append what the pipe holds now to *chunk; closes the pipe at EOF.
  void read_output(std::string* chunk);

  // waitpid(WNOHANG): the status once the process has exited.
  std::optional<ExitStatus> try_reap();
  bool exited() const { return exited_; }

  // Signal the worker's process group (the worker and what it spawned).
  void signal_group(int sig) const;

  // The write end of the worker's round channel (its stdin pipe, under
  // cluster.recover_in_place), owned from here on: closed with the Process.
  void set_channel_fd(int fd) { channel_fd_ = fd; }
  int channel_fd() const { return channel_fd_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int channel_fd_ = -1;
  bool exited_ = false;
};

}  // namespace dtrain::launcher
