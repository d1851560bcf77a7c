// Ring attention (Liu et al. 2023; the load-balanced causal layout of
// cp_layout.h): causal self-attention over a sequence split across the N
// ranks of a context-parallel group. Each rank keeps its queries; the K/V
// blocks go round the ring (rank r sends to r+1, receives from r-1) while
// it folds the block it holds into its queries' online softmax with the
// tiled kernel's steps (model/tiled_attention.h). Owns the ring and its
// autograd function; not the layout (cp_layout.h) nor the model wiring.
//
// Grouped-query attention: K and V hold the kv heads only and travel so,
// never repeated per query head.
//
// Bytes a rank sends through the cp group (what Group::bytes_sent counts),
// with N = cp size, BKV = batch rows x local kv heads, Tl = local length
// (T/N), D = head dim, e = the element size of k and v (they travel in their
// own dtype; the gradients travel in fp32):
//   forward   (N-1) * 2*BKV*Tl*D * e             K and V, N-1 hops
//   backward  (N-1) * 2*BKV*Tl*D * e             K and V again
//           +  N    * 2*BKV*Tl*D * 4             dK, dV with their block, and home
// and 0 for both when N = 1 or local_only (ring_attention_bytes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/comm/comm.h"
#include "engine/model/attention_core.h"
#include "engine/model/tiled_attention.h"

namespace dtrain::engine::parallel::context {

struct RingOptions {
  int64_t tile = model::kAttentionTile;  // query rows and key columns per tile (tiles never cross a chunk)
  // Negative control: each rank attends only to the keys of its own two
  // chunks (no ring, no traffic). Wrong on purpose for N > 1.
  bool local_only = false;
};

// The tags of the ring's send/recv on the cp group (below comm::kMaxUserTag);
// nothing else may use them on that group while attention runs.
constexpr int kRingKvTag = 0x52494e;     // K, V blocks
constexpr int kRingGradTag = 0x52494f;   // dK, dV accumulators

// q: [B*H, Tl, D], k, v: [B*KV, Tl, D] (KV dividing H), this rank's two
// chunks (cp_local of the full tensors along dim 1); returns [B*H, Tl, D], the rows of causal attention
// over the full sequence (T = Tl * N) that these queries produce, dropout
// included: the masks are those tiled/naive attention draws for the same
// global (row, head, query, key) elements. Computed in fp32; the output has
// q's dtype. Collective over cp (every member calls it, same shapes);
// backward is collective too. cp must outlive the autograd graph.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                          const model::AttentionDropout& drop, comm::Group& cp, const RingOptions& opt = {});

// The bytes of the formula above, per forward and per backward.
struct RingBytes {
  uint64_t forward = 0, backward = 0;
};
// bkv: K/V rows (batch rows x local kv heads).
RingBytes ring_attention_bytes(int cp, int64_t bkv, int64_t local_len, int64_t head_dim, int64_t elem_size,
                               bool local_only = false);

}  // namespace dtrain::engine::parallel::context
