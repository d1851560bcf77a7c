// The gradient norm and clipping every GradSync uses (GradSync::clip): this
// rank's squared sum of the gradients it counts, in fp64, summed over the
// groups whose members hold disjoint parts of the gradient, then every local
// gradient scaled in place (PyTorch's clip_grad_norm_). Which gradients a
// rank counts and over which groups is the caller's layout knowledge.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/comm/comm.h"

namespace dtrain::engine::parallel {

constexpr double kClipEps = 1e-6;  // factor = min(1, max_norm / (norm + kClipEps))

// grads: this rank's gradients; every one is scaled by the clip factor.
// counted[i]: whether grads[i]'s squares count on this rank (false for a
//   replica another rank counts, e.g. a TP-replicated parameter off TP rank
//   0); empty = every one. The local sum is optim::local_grad_sq_norm of the
//   counted ones, in their order.
// over: the groups the squared sum is all-reduced over, in this order (one
//   of size 1 is skipped); a NoSyncGroup's sum goes over the group it wraps
//   (comm::reducing_group: the fault leaves the norm as it was).
// global_sq: a squared norm already summed over its own groups (MoE's dense
//   part), added to this one.
// max_norm <= 0: nothing is scaled. Returns the global norm before scaling.
// scale: where given, the gradients are left as they are and *scale gets
//   the factor (1 when max_norm <= 0), for the optimizer to apply as it reads
//   them (optim::AdamW::step's grad_scale: one pass over them fewer).
double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      const std::vector<comm::Group*>& over, double max_norm, double global_sq = 0,
                      double* scale = nullptr);

}  // namespace dtrain::engine::parallel
