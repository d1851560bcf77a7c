// Expert parallelism (Megatron-Core / DeepSpeed-MoE's layout): the E experts
// of every MoE layer spread over the ep group, E / ep per rank, tokens moving
// by all-to-all; expert gradients summed over edp (the ranks holding the same
// experts), everything else over dp, through a GradSync that wraps the dense
// one (DDP or ZeRO). Not the routing itself (model/moe.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/model/gpt.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/param_layout.h"

namespace dtrain::engine::parallel {

// "blocks.<i>.moe.fc.weight" and the other per-expert tensors (not the router).
bool is_expert_param(const std::string& name);

struct ExpertParams {
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<ParamLayout> layouts;  // dim 0: this rank's experts of the global [E, ...]
};

// Cuts every expert tensor of `named_params` to this rank's experts (rows
// [rank * E / ep, (rank + 1) * E / ep) of dim 0), records that in its
// layout, and hands the model the group's all-to-all. Under sequence
// parallelism the routers' gradients are whole on every TP rank (the layer
// routes the gathered micro-batch): not summed over tp.
void apply_expert_parallel(model::GptImpl& model, const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                           std::vector<ParamLayout>& layouts, comm::Group& ep);

// The parameters split in two: the dense ones (for DDP / ZeRO over dp) and
// the experts (synchronised over edp), each with its layout.
struct DenseAndExperts {
  std::vector<std::pair<std::string, at::Tensor>> dense;
  std::vector<ParamLayout> dense_layouts;
  ExpertParams experts;
};
DenseAndExperts split_experts(const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                              const std::vector<ParamLayout>& layouts);

struct MoeSyncOptions {
  bool bias_balance = false;
  double bias_rate = 0.001;
};

// `dense` syncs the dense parameters over dp; this adds the experts: their
// gradients all-reduced over edp at finish(), clipping by the norm of both
// (expert squares added over ep, where the experts differ), the optimizer's
// tensors dense first then experts, checkpoints with each expert slice
// written by edp rank 0, and per step the routing counters summed over dp
// and pp (moe_aux_loss, moe_max_load, moe_dropped, ep_bytes_sent; the
// DeepSeek-V3 bias update). `tp`: only its rank 0 (with dp and ep rank 0)
// writes the replicated selection biases, each of its stage's layers. `pp`:
// the stages hold disjoint layers and experts (their counters and expert
// norms add up over it). `edp` is only the experts' gradient-reduction group
// (a comm::NoSyncGroup under fault.kind no_grad_sync); `dp` only sums the
// counters.
std::unique_ptr<GradSync> make_moe_sync(std::unique_ptr<GradSync> dense, ExpertParams experts, model::GptImpl& model,
                                        comm::Group& dp, comm::Group& tp, comm::Group& pp, comm::Group& ep,
                                        comm::Group& edp, MoeSyncOptions options);

}  // namespace dtrain::engine::parallel
