// The core of causal self-attention, from per-head q, k, v to the weighted
// values: scores, causal mask, softmax, dropout of the probabilities. Two
// implementations of the same function: naive (the [T, T] scores held in
// memory) and tiled (FlashAttention, tiled_attention.h). Owns neither the
// projections nor the head split (gpt.cpp) nor whether it is recomputed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "engine/random/philox.h"

namespace dtrain::engine::model {

// Dropout of the attention probabilities [B, H, T, T] with layout-invariant
// masks: the element's place is (global row, global head, query, key) in
// [global_rows, heads_global, T, T].
struct AttentionDropout {
  double p = 0.0;  // 0: no dropout (also when not training)
  random::DropoutKey key;  // site attn_probs
  int64_t global_rows = 0, row_begin = 0;   // dim 0: this micro-batch's rows of the step's batch
  int64_t heads_global = 0, head_begin = 0;  // dim 1: this rank's heads (tensor parallelism)
};

enum class AttentionKind { naive, tiled };
AttentionKind attention_kind(const std::string& name);  // "naive" | "tiled"

// q: [B*H, T, D] (B rows of H heads each); k, v: [B*KV, T, D], KV dividing
// H (grouped-query attention: query head h uses kv head h / (H / KV));
// returns [B*H, T, D]. causal_bias: the caller's cache of the [T, T]
// additive mask (naive only).
at::Tensor attention_core(AttentionKind kind, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          int64_t batch, const AttentionDropout& drop, at::Tensor* causal_bias);

// The naive core (grouped-query attention without repeating k and v: the
// G = H / KV query heads of a kv head as one [G*T, D] batch entry): softmax(q k^T / sqrt(D) + causal) (dropped) v through
// autograd's own ops (it saves the [B*H, T, T] probabilities and mask).
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                           const AttentionDropout& drop, at::Tensor* causal_bias);

// The naive core without the head-major copies, for a GPT's fused qkv
// projection on the CPU, in fp32, without dropout: qkv [B, T, 3*H*D] (q,
// k, v of head h at columns h*D, C + h*D, 2C + h*D) -> [B, T, H*D], the
// layout the output projection reads. The score, weighted-value and
// gradient GEMMs read q, k, v where the projection wrote them and write
// their results where the next op reads them (per row of the batch, a
// batch of H GEMMs with row stride 3C or C), so neither the forward nor
// the backward copies a head-major [B*H, T, D] tensor. The same GEMMs and
// softmax as naive_attention, so the same bits (attention_test). Saves qkv
// and the probabilities.
at::Tensor strided_attention(const at::Tensor& qkv, int64_t heads, at::Tensor* causal_bias);
// Whether strided_attention applies: qkv fp32 on the CPU, outside autocast,
// and not turned off (DTRAIN_STRIDED_ATTENTION=0, for A/B runs).
bool strided_attention_applies(const at::Tensor& qkv);

}  // namespace dtrain::engine::model
