// `dtrain launch` as a library call: run the node agent for one spec
// (embedded rendezvous server on node 0 / one machine), until the job ends.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::launcher {

struct LaunchOptions {
  int node_rank = -1;                // -1: one machine, or from SLURM_NODEID
  std::string rdzv;                  // HOST:PORT of the rendezvous ("" = spec's endpoint)
  std::string advertise_addr;        // --advertise-addr ("" = spec's, else the route's source)
  std::string hostname;              // --hostname: the name this node reports ("" = gethostname)
  std::vector<int> console_ranks;    // ranks whose output reaches the console (empty = all)
  bool allow_slow = false;
  std::vector<std::string> extra_env;  // "K=V" added to every worker's environment
  std::string resume_from;  // a checkpoint to load first ("" = checkpoint.dir's latest, if any)
  bool fresh = false;       // move checkpoint.dir's old steps aside and start from scratch
  bool allow_large = false; // skip the training-state-fits-in-memory check (plan/model_size.h)
};

// Returns the job's exit code (0 when every worker of the final round
// exited 0). Throws dtrain::Error for refusals and timeouts.
// Exit codes: 0 success; the first failed worker's exit code, or 128 + its
// signal, once cluster.max_restarts are used up (after the root-cause
// block); 128 + sig when dtrain itself got SIGINT/SIGTERM (forwarded to the
// workers, SIGKILL after cluster.grace_s; it returns only when none is left).
// A lost rendezvous (3 missed heartbeats) throws Error(rendezvous).
// Before anything starts, log.dir and checkpoint.dir are locked for this job
// (launcher/run_dir_lock.h; a directory in use by another job is refused)
// and checkpoint.dir's old steps are dealt with (launcher/checkpoint_start.h).
int launch(const JobSpec& spec, const LaunchOptions& options);

// Directory of the running dtrain binary (to find dtrain-worker beside it).
std::string self_dir();

}  // namespace dtrain::launcher
