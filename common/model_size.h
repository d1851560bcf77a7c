// How big a job's model and training state are, from the spec alone (no
// LibTorch): parameter count of the GPT, fp32 training state (parameters,
// gradients, AdamW's two moments) for the whole model, one rank and one
// machine, and whether that fits this machine's memory. Activations and
// communication buffers are not counted (they scale with the batch).
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"

namespace dtrain {

// Largest model dtrain accepts: 10^12 parameters (16 TB of fp32 state).
constexpr double kMaxParams = 1e12;
// Bytes per parameter of fp32 training: param + grad + AdamW m and v.
constexpr double kStateBytesPerParam = 16.0;

struct ModelSize {
  double params = 0;      // the whole model (doubles: no overflow at any spec)
  double state_bytes = 0; // params x 16 B
  double rank_bytes = 0;  // one rank: split by tp * pp, ZeRO stages split by dp
  double node_bytes = 0;  // cluster.procs_per_node ranks on one machine
};

ModelSize model_size(const JobSpec& spec);

// Physical memory of this machine (or the cgroup's limit when lower); 0 = unknown.
uint64_t machine_memory_bytes();

// "1.50 GB"
std::string gigabytes(double bytes);

// Throws dtrain::Error(config) when cluster.device = cpu and one machine's
// ranks need more memory for their training state than this machine has,
// unless allow_large. GPU memory is the device's: not checked here.
void check_fits_memory(const JobSpec& spec, bool allow_large);

}  // namespace dtrain
