// WorkerWatch: a small process beside the agent that stops the agent's
// workers when the agent dies, however it dies (SIGKILL, OOM killer, a
// crash), whatever the entrypoint (a Python script, a shell and what it
// forks). The agent keeps one end of a socket to it and tells it each
// worker session it starts and ends; a clean exit says "quit". When the
// socket reaches EOF before that, the watcher sends SIGTERM to every process
// of the sessions it holds, waits grace_s, then SIGKILLs what is left, and
// exits. It neither reaps nor supervises workers: the agent does both.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

namespace dtrain::launcher {

// argv[1] of `dtrain` that runs the watcher (apps/dtrain/main.cpp).
inline constexpr const char* kWatchWorkersCommand = "__watch-workers";

class WorkerWatch {
 public:
  // Spawns the watcher (this executable, `dtrain __watch-workers GRACE AGENT_PID`,
  // in a session of its own, so a signal to the agent's process group does
  // not reach it). Null, with a warning, when it cannot be started.
  static std::unique_ptr<WorkerWatch> start(double grace_s);
  // Tells the watcher to quit without touching anything, and reaps it.
  ~WorkerWatch();
  WorkerWatch(const WorkerWatch&) = delete;
  WorkerWatch& operator=(const WorkerWatch&) = delete;

  void watch(pid_t sid);   // a worker session started
  void forget(pid_t sid);  // ... and is gone (the agent killed and reaped it)
  void remove_on_death(const std::string& dir);  // the agent's RAM directory (memory_copies.h)
  pid_t pid() const { return pid_; }

 private:
  WorkerWatch(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void send(const std::string& line);

  pid_t pid_;
  int fd_;
};

// The watcher's main: reads the agent's lines from fd until "q" (returns 0)
// or EOF (stops the sessions it holds, removes the directory it was given,
// returns 0).
int run_worker_watch(int fd, double grace_s, pid_t agent);

}  // namespace dtrain::launcher
