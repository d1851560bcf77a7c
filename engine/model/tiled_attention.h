// Tiled causal attention (FlashAttention, Dao et al. 2022, in its v2 loop
// order) on the CPU: queries and keys in tiles, an online softmax (running
// max and sum per query row), the output accumulated tile by tile; memory
// O(T x D) per head instead of O(T^2). Backward recomputes each tile's
// scores from the saved log-sum-exp. Tiles wholly above the causal diagonal
// are skipped. Owns only this kernel; the naive peer is attention_core.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/model/attention_core.h"

namespace dtrain::engine::model {

constexpr int64_t kAttentionTile = 64;  // query rows and key columns per tile

// q, k, v: [B*H, T, D]; returns [B*H, T, D], the same function as
// naive_attention (dropout masks included: drawn per tile from the same
// layout-invariant generator, for the same global elements). Computed in
// fp32 whatever the inputs' dtype; the output has q's dtype.
at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                           const AttentionDropout& drop, int64_t tile = kAttentionTile);

}  // namespace dtrain::engine::model
