// `dtrain plan --suggest --world N`: the meshes of N ranks (dp x tp x pp,
// and ep for a MoE model) with ZeRO stage and recompute that the builtin
// engine runs, keep the global batch and fit the memory budget, ranked by
// a predicted step time (compute and the pipeline bubble plus each rank's
// bytes over its links, plan/ and rendezvous/'s placement). CLI only.
#pragma once

#include <cstdint>
#include <iosfwd>

#include "common/job_spec.h"

namespace dtrain::app {

struct SuggestOptions {
  int world = 0;
  int64_t budget = 0;   // bytes per rank; 0 = no budget
  double gflops = 0;    // measured matmul rate of this CPU (cpu clusters); 0 = unknown
};

// Prints the best layouts (at most 15) to `out`. Throws dtrain::Error(config)
// when none fits the budget, naming the smallest need found and its layout.
void print_suggestions(const JobSpec& base, const SuggestOptions& options, std::ostream& out);

}  // namespace dtrain::app
