// WarmSpares: idle dtrain-worker processes, one per local rank, that have
// loaded LibTorch and wait on their stdin for a worker's environment. A
// restart hands one its rank (take()) instead of starting a process, which
// skips exec and the library load. Owns the spares until they are taken;
// knows nothing of rounds or ranks (the agent decides when to fill and take).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "launcher/process.h"
#include "launcher/worker.h"
#include "launcher/worker_watch.h"

namespace dtrain::launcher {

// Set in a spare's environment: dtrain-worker then reads its real
// environment from stdin before anything else (apps/dtrain-worker/main.cpp).
inline constexpr const char* kWarmSpareEnv = "DTRAIN_WARM_SPARE";

class WarmSpares {
 public:
  explicit WarmSpares(WorkerWatch* watch) : watch_(watch) {}
  // Spares still idle are SIGKILLed, reaped and forgotten by the watch.
  ~WarmSpares();
  WarmSpares(const WarmSpares&) = delete;
  WarmSpares& operator=(const WarmSpares&) = delete;

  // Starts a spare for each slot that has none, from like[slot] (argv and
  // the environment read while libraries load: the current workers' specs).
  // A spare that cannot be started is skipped with a warning.
  void fill(const std::vector<WorkerSpec>& like);

  // The spare of `slot` given spec.env, or null (none, it exited, or the
  // environment its libraries loaded with differs from spec.env's: then it
  // is discarded and the caller starts a process as usual).
  // keep_channel: the pipe stays open as the worker's round channel
  // (Process::channel_fd, recovery in place) instead of being closed.
  std::unique_ptr<Process> take(size_t slot, const WorkerSpec& spec, bool keep_channel = false);

  // Pid of the idle spare of slot (-1: none).
  pid_t pid(size_t slot) const;

 private:
  struct Spare {
    std::unique_ptr<Process> process;
    int fd = -1;                   // write end of its stdin pipe
    std::vector<std::string> env;  // what it started with
  };
  void discard(Spare& spare);

  WorkerWatch* watch_;
  std::vector<Spare> spares_;  // by slot (local rank); process null = none
};

// The variables a process reads while its libraries load (the dynamic
// loader, OpenMP, BLAS, malloc, c10's start-up), "K=V", sorted: a spare
// serves only an environment whose list equals the one it started with.
std::vector<std::string> load_time_env(const std::vector<std::string>& env);

// The bytes a spare reads from stdin: each "K=V" then NUL, and one more NUL.
std::string spare_payload(const std::vector<std::string>& env);

}  // namespace dtrain::launcher
