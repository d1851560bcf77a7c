// How big a job's model and training state are, from the spec alone:
// parameter count (gpt_params.h), fp32 training state (parameters,
// gradients, AdamW's two moments) for the whole model, one rank and one
// machine; the largest model dtrain accepts, and whether a job's state fits
// this machine. Activations and buffers: memory_plan.h.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// Largest model dtrain accepts: 10^12 parameters (16 TB of fp32 state).
constexpr double kMaxParams = 1e12;
// Bytes per parameter of fp32 training: param + grad + AdamW m and v.
constexpr double kStateBytesPerParam = 16.0;

struct ModelSize {
  double params = 0;      // the whole model (doubles: no overflow at any spec)
  double state_bytes = 0; // params x 16 B
  double rank_bytes = 0;  // one rank: split by tp * pp, ZeRO stages split by dp
  double node_bytes = 0;  // cluster.procs_per_node ranks on one machine
  // Where one rank's bytes live under train.offload (they sum to rank_bytes,
  // plus, under optimizer host, the fp32 master the CPU updates): AdamW's
  // moments move to host memory or to nvme files, and so do ZeRO-3's
  // weight shards under train.offload.params nvme; the rest stays.
  double optim_rank_bytes = 0;  // AdamW's m and v of one rank, wherever they live
  double device_rank_bytes = 0, host_rank_bytes = 0, nvme_rank_bytes = 0;
};

ModelSize model_size(const JobSpec& spec);

// The model's problem when it has more than kMaxParams parameters (the
// fields to change and the count), else nothing. Every later figure
// assumes a model below the limit.
std::vector<std::string> model_size_problems(const JobSpec& spec);
// Throws dtrain::Error(config) with that problem. Every command that
// computes figures from a spec calls it first (the parser does not know
// the parameter count).
void check_model_size(const JobSpec& spec);

// Throws dtrain::Error(config) when one machine's ranks need more host
// memory for their training state than this machine has (cluster.device
// cpu: all but what train.offload puts in nvme files; cuda: what it puts in
// host memory), unless allow_large. GPU memory is the device's: not checked here.
void check_fits_memory(const JobSpec& spec, bool allow_large);

}  // namespace dtrain::plan
