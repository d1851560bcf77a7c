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

}  // namespace dtrain::engine::model
