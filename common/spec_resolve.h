// Sizes a spec may leave to dtrain: `parallel.dp: auto` (= world / (tp x pp))
// and `train.grad_accum: auto` (= train.global_batch / (micro_batch x dp)).
// Resolved when the spec loads (the world from cluster.nodes x procs_per_node)
// and again for each rendezvous round (the world from the nodes that joined).
// Pure functions; who joined a round is the rendezvous' business, not this.
#pragma once

#include <string>

#include "common/job_spec.h"

namespace dtrain {

// The grad_accum that keeps `global_batch` sequences per step with `dp`
// data-parallel ranks of `micro_batch` each; 0, with *why set to one line
// naming the values and the fix, when it does not divide.
int auto_grad_accum(int global_batch, int micro_batch, int dp, std::string* why);

// The spec one round runs: cluster.nodes = nodes, parallel.dp = dp (the
// round's mesh) and grad_accum re-derived when auto. The auto flags are
// cleared, so the printed spec (DTRAIN_SPEC) holds the numbers themselves.
// Throws Error(config) when grad_accum auto does not divide.
JobSpec spec_for_round(const JobSpec& spec, int nodes, int dp);

// How `resolved` settled the auto fields of `spec`, for the log:
// "parallel.dp = auto -> 2 (world 2 / (tp 1 x pp 1)), train.grad_accum = auto
// -> 3 (global_batch 12 / (micro_batch 2 x dp 2))"; "" when nothing is auto.
std::string auto_sizes_text(const JobSpec& spec, const JobSpec& resolved);

}  // namespace dtrain
