// flops_per_step (flops.h). Legend: b = micro_batch, s = seq_len,
// h = d_model, V = vocab, L = layers. A forward's matmuls are 24bsh^2 +
// 4bs^2h per layer (the block's 12h^2 weights, gpt_params.h, and the
// scores; causal: half the score work is skipped only by tiled attention)
// plus the head's 2bshV; backward is twice the forward; recompute adds a
// forward of the blocks (full) or of the attention core (selective).
// MoE blocks are counted as dense ones.
#include "plan/flops.h"

namespace dtrain::plan {

double flops_per_step(const JobSpec& spec) {
  const double b = spec.train.micro_batch, s = spec.model.seq_len, h = spec.model.d_model;
  const double V = spec.model.vocab, L = spec.model.layers;
  const bool tiled = spec.model.attention == AttentionImpl::tiled;
  const double bs = b * s, micro_batches = double(spec.global_batch()) / b;
  const double layer_mm = 24.0 * bs * h * h, layer_att = 4.0 * bs * s * h * (tiled ? 0.5 : 1.0);
  const double fwd = L * (layer_mm + layer_att) + 2.0 * bs * h * V;
  double re = 0;
  if (spec.train.recompute == Recompute::full) re = L * (layer_mm + layer_att);
  if (spec.train.recompute == Recompute::selective) re = L * layer_att;
  return micro_batches * (3 * fwd + re);
}

}  // namespace dtrain::plan
