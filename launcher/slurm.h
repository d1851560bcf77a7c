// What `dtrain launch` takes from a SLURM allocation: node rank
// (SLURM_NODEID), node count (SLURM_NNODES) and the rendezvous host (the
// first host of SLURM_JOB_NODELIST). Parsing only; it launches nothing.
#pragma once

#include <string>

namespace dtrain::launcher {

struct SlurmEnv {
  bool present = false;    // SLURM_NODEID and SLURM_NNODES both set
  int node_rank = -1;
  int nodes = 0;
  std::string first_host;  // "" when SLURM_JOB_NODELIST is unset

  static SlurmEnv from_environment();
};

// First host of a SLURM node list: "node[01-04,07],gpu5" -> "node01",
// "a,b" -> "a", "rack[2-3]-n[1-4]" -> "rack2-n1" (each bracket's first value).
std::string slurm_first_host(const std::string& nodelist);

}  // namespace dtrain::launcher
