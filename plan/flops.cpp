// flops_per_step (flops.h). Legend: b = micro_batch, s = seq_len,
// h = d_model, V = vocab, L = layers, W_l = the weight elements block l
// multiplies a token with (gpt_params.h block_matmul_numel: the GPT's 12h^2;
// a llama's q, kv, proj and SwiGLU's three matrices; a MoE block's router
// and its top_k experts, not all E). A forward's matmuls are 2bsW_l +
// 4bs^2h per layer (the weights and the scores, q k^T and p v; grouped-query
// attention shares k and v but each query head still scores; causal: half
// the score work is skipped only by tiled attention) plus the head's 2bshV;
// backward is twice the forward; recompute adds a forward of the blocks
// (full) or of the attention core (selective).
#include "plan/flops.h"

#include "plan/gpt_params.h"

namespace dtrain::plan {

namespace {
// sum over blocks of W_l: two kinds of block at most (dense, MoE), each counted once.
double blocks_matmul_numel(const ModelSpec& m) {
  const double moe_blocks = double(moe_block_count(m)), dense_blocks = double(m.layers) - moe_blocks;
  double w = 0;
  if (dense_blocks > 0) w += dense_blocks * block_matmul_numel(m, m.moe.experts > 0 ? 1 : 0);
  if (moe_blocks > 0) w += moe_blocks * block_matmul_numel(m, 0);
  return w;
}
}  // namespace

double flops_per_token(const ModelSpec& m) {
  const double n = blocks_matmul_numel(m) + double(m.d_model) * m.vocab;
  return 6.0 * n + 12.0 * double(m.layers) * m.d_model * m.seq_len;
}

double flops_per_step(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  const double b = spec.train.micro_batch, s = m.seq_len, h = m.d_model;
  const double V = m.vocab, L = m.layers;
  const bool tiled = m.attention == AttentionImpl::tiled;
  const double bs = b * s, micro_batches = double(spec.global_batch()) / b;
  const double mm = 2.0 * bs * blocks_matmul_numel(m), att = L * 4.0 * bs * s * h * (tiled ? 0.5 : 1.0);
  const double fwd = mm + att + 2.0 * bs * h * V;
  double re = 0;
  if (spec.train.recompute == Recompute::full) re = mm + att;
  if (spec.train.recompute == Recompute::selective) re = att;
  return micro_batches * (3 * fwd + re);
}

}  // namespace dtrain::plan
