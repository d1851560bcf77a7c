// A mixture-of-experts MLP (model/): a softmax router choosing each token's
// top-k of E expert MLPs, a per-expert capacity with deterministic drops, the
// dispatch and combine of tokens (an all-to-all over the expert-parallel group
// when one is set), the Switch Transformer auxiliary loss and load counters.
// Knows nothing of process groups: expert parallelism hands it an EpGroup.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model/tp_ops.h"

namespace dtrain::engine::model {

struct MoeConfig {
  int experts = 0;  // 0 = dense (no MoE block)
  int top_k = 1;
  double capacity_factor = 1.25;
  double aux_loss_coef = 0.01;
  int every = 1;              // blocks 0, every, 2 * every, ... are MoE (Megatron's moe_layer_freq)
  bool bias_balance = false;  // DeepSeek-V3's selection bias (balance: bias)
  int d_ff = 0;               // an expert's hidden width; 0 = 4 * d_model
  // Mixtral (model.kind llama): SwiGLU experts without biases (fc [E, 2F, C]
  // = [gate; up], proj [E, C, F]) and the k gates always renormalised to
  // sum to 1 (top-1 included).
  bool llama = false;
  // Experts this rank builds (expert parallelism cuts at construction: its
  // E / ep); 0: all E.
  int local_experts = 0;
  bool is_moe_block(int layer) const { return experts > 0 && layer % every == 0; }
};

// The expert-parallel group as the layer sees it: this rank holds experts
// [rank * E / size, (rank + 1) * E / size). all_to_all: dim 0 rows,
// in_splits[i] rows to rank i, out_splits[i] rows from rank i.
struct EpGroup {
  int rank = 0;
  int size = 1;
  std::function<void(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits)>
      all_to_all;
  bool active() const { return size > 1; }
};

// What this rank's forwards routed since the last reset (one optimizer step):
// assignments per expert before capacity, dropped assignments, all
// assignments (tokens * k), the sum of the micro-batches' aux losses and
// the number of forwards.
struct MoeCounters {
  std::vector<double> load;  // [E]
  double dropped = 0;
  double assigned = 0;
  double aux_sum = 0;
  double forwards = 0;
  void reset(int experts) { load.assign(size_t(experts), 0.0), dropped = assigned = aux_sum = forwards = 0; }
};

// E linears side by side: weight [E, out, in], bias [E, out] (undefined
// without bias; under expert parallelism the rank's [E / ep, ...] slice).
class ExpertLinearImpl : public torch::nn::Module {
 public:
  ExpertLinearImpl(int experts, int in, int out, bool bias = true);
  at::Tensor weight, bias;
};
TORCH_MODULE(ExpertLinear);

class MoeImpl : public torch::nn::Module {
 public:
  MoeImpl(const MoeConfig& cfg, int d_model);
  // x [B, T, C] -> [B, T, C]: sum over the chosen experts of gate * expert(x);
  // a dropped assignment adds nothing (the block's residual carries the token).
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear router{nullptr};  // C -> E, no bias
  ExpertLinear fc{nullptr};           // per expert C -> F (F = d_ff, default 4C)
  ExpertLinear proj{nullptr};         // per expert F -> C
  // balance bias: added to the router probabilities for choosing only (not
  // for the gates), moved by the caller after each step; [E], no gradient.
  at::Tensor selection_bias;
  at::Tensor last_aux;  // the last forward's aux loss (with its graph), [] fp32
  MoeCounters counters;
  const EpGroup* ep = nullptr;  // nullptr or size 1: every expert is local
  // Tensor parallelism: every rank of the TP group holds the same N tokens
  // (no sequence parallelism), routes all of them (the same routing), and
  // dispatches its N / tp share only; the expert outputs of the shares are
  // all-gathered over tp before the combine.
  const TpGroup* tp = nullptr;
  const MoeConfig& config() const { return cfg_; }
  // DeepSeek-V3's aux-loss-free balancing, after a step: b_i += rate *
  // sign(mean load - load_i), `load` counted over the whole global batch.
  void update_selection_bias(const std::vector<double>& load, double rate);

 private:
  // Rows grouped by local expert (counts[j] rows for this rank's j-th
  // expert, in order) through their expert MLPs.
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts);
  MoeConfig cfg_;
};
TORCH_MODULE(Moe);

// The routing of one micro-batch, exposed for tests: probabilities [N, E],
// chosen experts [N, k] and gates [N, k], the assignment order (choice-major:
// a = j * N + n for token n's j-th choice), which assignments fit their
// expert's capacity and the Switch aux loss.
struct Routing {
  at::Tensor probs, experts, gates;
  at::Tensor keep;   // [k * N] bool
  at::Tensor load;   // [E] int64: assignments per expert before capacity
  int64_t capacity = 0;
  at::Tensor aux;    // [] alpha * E * sum_i f_i * P_i
};
Routing moe_route(const at::Tensor& logits, const MoeConfig& cfg, const at::Tensor& selection_bias);

// ceil(tokens * k * capacity_factor / E), at least 1.
int64_t moe_capacity(int64_t tokens, const MoeConfig& cfg);

}  // namespace dtrain::engine::model
