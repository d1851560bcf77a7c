// Tiled causal attention (FlashAttention, Dao et al. 2022, in its v2 loop
// order) on the CPU: queries and keys in tiles, an online softmax (running
// max and sum per query row), the output accumulated tile by tile; memory
// O(T x D) per head instead of O(T^2). Backward recomputes each tile's
// scores from the saved log-sum-exp. Tiles wholly above the causal diagonal
// are skipped. Owns this kernel and its per-(query tile, key tile) steps,
// which ring attention (parallel/context/) shares; the naive peer is
// attention_core.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>

#include "engine/model/attention_core.h"

namespace torch::autograd {
struct AutogradContext;
}

namespace dtrain::engine::model {

constexpr int64_t kAttentionTile = 64;  // query rows and key columns per tile

// q: [B*H, T, D], k, v: [B*KV, T, D] (KV dividing H: grouped-query
// attention, k and v not repeated); returns [B*H, T, D], the same function as
// naive_attention (dropout masks included: drawn per tile from the same
// layout-invariant generator, for the same global elements). Computed in
// fp32 whatever the inputs' dtype; the output has q's dtype.
at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                           const AttentionDropout& drop, int64_t tile = kAttentionTile);

// The steps of the kernel, for kernels that feed it tiles in another order
// (ring attention). Positions i0 (queries) and j0 (keys) are global: they
// place the causal diagonal and the dropout masks. All tensors fp32.
// Legend: BH = batch rows x local heads, D = head dim, ti / tj = a query /
// key tile's length.
namespace tile {

// The kernel works in fp32 with its own casts: autocast must not turn its
// matmuls into bf16 ones.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

// Where a tile's dropout masks come from: the micro-batch's rows and heads
// (drop), its local row count, and the global sequence length T; and
// grouped-query attention's G query heads per k, v row: a query tile then
// holds, per k, v row, the G heads' rows one after another ([BH/G, G*ti, D]).
struct TileDropout {
  const AttentionDropout* drop;
  int64_t batch, heads, T;
  int64_t groups = 1;
};

// One query tile's online softmax: running max m and sum l, unnormalised
// output acc.
struct TileState {
  at::Tensor m;    // [BH, ti], -inf before the first key tile
  at::Tensor l;    // [BH, ti]
  at::Tensor acc;  // [BH, ti, D]
};
TileState start(int64_t bh, int64_t ti, int64_t d, const at::TensorOptions& options);

// Folds key tile (kj, vj) [BH, tj, D] at j0 into query tile qi [BH, ti, D]
// at i0. causal: mask keys after queries (by global position); false only
// where every key precedes every query. The caller skips tiles wholly above
// the diagonal (j0 >= i0 + ti): a row that sees no key has no softmax.
void forward_step(TileState& st, const at::Tensor& qi, const at::Tensor& kj, const at::Tensor& vj, double scale,
                  int64_t i0, int64_t j0, bool causal, const TileDropout& drop);

// The finished tile: out_i = acc / l and lse_i = m + log(l), written into
// the caller's [BH, ti, D] and [BH, ti] views.
void finish(TileState& st, at::Tensor out_i, at::Tensor lse_i);

// Backward of one (query tile, key tile) pair: adds its share to dqi [BH,
// ti, D], dkj and dvj [BH, tj, D] (views into the caller's gradients).
// lse_i, delta_i: [BH, ti, 1], the forward's log-sum-exp and rowsum(dO * O).
void backward_step(const at::Tensor& qi, const at::Tensor& kj, const at::Tensor& vj, const at::Tensor& doi,
                   const at::Tensor& lse_i, const at::Tensor& delta_i, at::Tensor dqi, at::Tensor dkj,
                   at::Tensor dvj, double scale, int64_t i0, int64_t j0, bool causal, const TileDropout& drop);

// The dropout settings through an autograd context's saved_data.
void save_dropout(torch::autograd::AutogradContext* ctx, const AttentionDropout& d);
AttentionDropout load_dropout(torch::autograd::AutogradContext* ctx);

}  // namespace tile
}  // namespace dtrain::engine::model
