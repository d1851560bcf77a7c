// Bytes each rank sends per training step, per mesh axis group: the inputs
// (TrafficModel, from the job spec) and one formula per axis (traffic.cpp).
// Placement (rendezvous/topology.h) weighs groups by these bytes when it
// decides which axis gets the fast links, and `dtrain topo` prints them.
// Axis sizes come as plain ints, not a mesh type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// Per-step traffic inputs (bytes per element included), from the job spec.
struct TrafficModel {
  uint64_t params = 0;       // the parameters dp reduces: the whole model's but the experts (gpt_params.h)
  int bytes_per_elem = 4;    // gradient / activation element size
  int zero = 0;
  int micro_batch = 1;
  int grad_accum = 1;        // = pipeline micro-batches
  int seq_len = 1;
  int d_model = 1;
  int layers = 1;
  std::vector<int> stage_layers;  // blocks per global pipeline stage (pp x virtual stages); empty: even
  int moe_layers = 0;        // MoE blocks (model.moe) of the whole model
  int moe_every = 1;         // block l is MoE when l % moe_every == 0 (and experts > 0)
  int experts = 0, top_k = 1;
  uint64_t expert_params = 0;  // one expert's parameters (fp32 gradients, reduced over edp)
  bool sequence_parallel = false;  // MoE blocks then gather the positions over tp
};
TrafficModel traffic_model_from_spec(const JobSpec& spec);

// The mesh's axis sizes.
struct AxisSizes {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
};

// Bytes per step that each member of one `axis` group (a group name of
// common/mesh.h: "dp", "tp", "pp", "cp", "ep", "edp", "dp_cp") of `group_size` ranks
// sends; `stage` is the group's pipeline rank (every member of a non-pp
// group is in one stage). 0 for an axis without traffic.
uint64_t axis_bytes_per_step(const std::string& axis, int group_size, int stage, const AxisSizes& sizes,
                             const TrafficModel& traffic);

}  // namespace dtrain::plan
