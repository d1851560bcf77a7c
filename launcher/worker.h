// The node agent's data, apart from its behaviour (torch.distributed.elastic's
// model): what to run (WorkerSpec), one running worker (Worker) and this
// node's workers of one rendezvous round (WorkerGroup). No process handling here.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/exit_status.h"

namespace dtrain::launcher {

// State of one worker, and of a group (the group's state is the summary of
// its workers' states).
//
//   INIT ──spawn──▶ HEALTHY ──exit 0──────────────────▶ SUCCEEDED
//    │                 │ ───exit≠0 or signal (not ours)─▶ FAILED
//    │                 └───stopped by the agent─────────▶ STOPPED
//    └──spawn failed──────────────────────────────────▶ FAILED
//
// SUCCEEDED, FAILED and STOPPED are final for a round. A restart or a new
// round (membership change) builds a fresh group whose workers start at INIT.
// A worker that exits while the agent stops the group is STOPPED, whatever
// its exit status, so it is never mistaken for the root cause.
enum class WorkerState { INIT, HEALTHY, SUCCEEDED, FAILED, STOPPED };

inline const char* worker_state_name(WorkerState state) {
  switch (state) {
    case WorkerState::INIT: return "INIT";
    case WorkerState::HEALTHY: return "HEALTHY";
    case WorkerState::SUCCEEDED: return "SUCCEEDED";
    case WorkerState::FAILED: return "FAILED";
    case WorkerState::STOPPED: return "STOPPED";
  }
  return "?";
}

// What to run for one worker.
struct WorkerSpec {
  std::vector<std::string> argv;  // argv[0] looked up on PATH when it has no '/'
  std::vector<std::string> env;   // the complete environment, "K=V"
  std::string log_path;           // <log.dir>/rank_<r>.log
  std::string error_file;         // <log.dir>/error_rank_<r>.json (DTRAIN_ERROR_FILE)
  bool console = true;            // copy its output to the console with "[rank r] "
};

struct Worker {
  int rank = -1;        // global rank (RANK)
  int local_rank = -1;  // index on this node (LOCAL_RANK)
  WorkerSpec spec;
  pid_t pid = -1;
  WorkerState state = WorkerState::INIT;
  ExitStatus exit;                               // valid once it has exited
  std::chrono::system_clock::time_point ended;   // when the agent saw it exit
  std::string error_file_text;                   // what it wrote to DTRAIN_ERROR_FILE
};

struct WorkerGroup {
  uint64_t round = 0;  // rendezvous round these workers belong to
  int restart = 0;     // DTRAIN_RESTART of this group
  int node_rank = 0;   // GROUP_RANK
  int world = 1;       // WORLD_SIZE
  std::vector<Worker> workers;  // by local rank
  WorkerState state = WorkerState::INIT;
};

}  // namespace dtrain::launcher
