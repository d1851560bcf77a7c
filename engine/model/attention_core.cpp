// attention_core.h: the naive core (one baddbmm with the causal bias and
// the 1/sqrt(D) scale fused, softmax, dropout, bmm) and the dispatch.
//
// Shape legend: B = batch rows, H = local heads, T = time, D = head dim.
#include "engine/model/attention_core.h"

#include <ATen/ops/baddbmm.h>
#include <ATen/ops/full.h>
#include <ATen/ops/softmax.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "engine/model/tiled_attention.h"

namespace dtrain::engine::model {

AttentionKind attention_kind(const std::string& name) {
  if (name == "naive") return AttentionKind::naive;
  if (name == "tiled") return AttentionKind::tiled;
  throw Error(ErrorCode::config, "model.attention = " + name + " is not one of naive, tiled");
}

at::Tensor attention_core(AttentionKind kind, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          int64_t batch, const AttentionDropout& drop, at::Tensor* causal_bias) {
  if (kind == AttentionKind::tiled) return tiled_attention(q, k, v, batch, drop);
  return naive_attention(q, k, v, batch, drop, causal_bias);
}

at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                           const AttentionDropout& drop, at::Tensor* causal_bias) {
  const int64_t BH = q.size(0), T = q.size(1), D = q.size(2), H = BH / batch;
  // Causal mask: position t attends to positions <= t only. Fused into the
  // score GEMM as an additive bias (beta 1), with the 1/sqrt(D) scale as its
  // alpha: one pass over [B*H, T, T] instead of matmul, mul and masked_fill.
  at::Tensor& bias = *causal_bias;
  if (!bias.defined() || bias.size(0) != T || bias.scalar_type() != q.scalar_type() ||
      bias.device() != q.device()) {
    at::NoGradGuard no_grad;
    bias = at::full({T, T}, -std::numeric_limits<float>::infinity(), q.options()).triu_(1);  // [T, T]
  }
  // Grouped-query attention: q [B*KV, G*T, D] (a view: head h = kv * G + g),
  // scores [B*KV, G*T, T] = [B*H, T, T] in memory, the mask repeated G times.
  const int64_t G = BH / k.size(0);
  const at::Tensor qg = G == 1 ? q : q.view({k.size(0), G * T, D});
  const at::Tensor bias_g = G == 1 ? bias : bias.repeat({G, 1});  // [G*T, T]
  auto att = at::baddbmm(bias_g, qg, k.transpose(1, 2), /*beta=*/1.0, /*alpha=*/1.0 / std::sqrt(double(D)));  // [BH, T, T]
  att = at::softmax(att, /*dim=*/-1);
  if (drop.p > 0.0) {
    att = random::layout_invariant_dropout(
              att.view({batch, H, T, T}), drop.p, true, drop.key, {drop.global_rows, drop.heads_global, T, T},
              {{drop.row_begin, drop.row_begin + batch}, {drop.head_begin, drop.head_begin + H}, {0, T}, {0, T}})
              .view({BH, T, T});
  }
  if (G > 1) att = att.view({k.size(0), G * T, T});
  return att.bmm(v).view({BH, T, D});  // [BH, T, D]
}

}  // namespace dtrain::engine::model
