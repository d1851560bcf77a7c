// The worker's environment contract (docs/ARCHITECTURE.md, 'The worker's environment'):
// torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK, ..., MASTER_ADDR/PORT) plus DTRAIN_*.
// Pure: builds "K=V" strings from plain inputs; reads no global state.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/rendezvous_types.h"

namespace dtrain::launcher {

struct WorkerEnvInputs {
  std::vector<std::string> base;        // the agent's environment ("K=V")
  const rendezvous::Assignment* assignment = nullptr;
  int restart = 0;                      // DTRAIN_RESTART / TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;
  std::string job;                      // TORCHELASTIC_RUN_ID
  std::string spec_path;                // DTRAIN_SPEC
  std::string run_dir;                  // DTRAIN_RUN_DIR (= log.dir)
  int cores = 1;                        // online CPUs, for the *_NUM_THREADS defaults
  std::vector<std::string> extra_env;   // "K=V", applied last (--env style overrides)
  // The interface of the address this node advertises: GLOO_SOCKET_IFNAME
  // unless the environment sets one ("" or loopback: left unset).
  std::string gloo_ifname;
  // The agent's pid, as DTRAIN_AGENT_PID: its worker watch finds by it a
  // worker the agent died before registering (0: not set).
  int agent_pid = 0;
};

// <run_dir>/error_rank_<r>.json
std::string error_file_path(const std::string& run_dir, int rank);

// The complete environment of the worker `local` (one of assignment->local_ranks).
// Contract variables override inherited ones; OMP/OPENBLAS/MKL_NUM_THREADS
// default to max(1, cores / local workers) unless already set. The agent's
// DTRAIN_TOKEN is not inherited (only extra_env can pass it).
std::vector<std::string> worker_env(const WorkerEnvInputs& in,
                                    const rendezvous::RankPlacement& local);

}  // namespace dtrain::launcher
