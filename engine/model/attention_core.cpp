// attention_core.h: the naive core (one baddbmm with the causal bias and
// the 1/sqrt(D) scale fused, softmax, dropout, bmm), its strided form on a
// fused qkv projection (bmm, then the causal softmax kernel), and the
// dispatch.
//
// Shape legend: B = batch rows, H = local heads, T = time, D = head dim.
#include "engine/model/attention_core.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/softmax.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/ab_switch.h"
#include "common/error.h"
#include "engine/model/fused_kernels.h"
#include "engine/model/tiled_attention.h"

namespace dtrain::engine::model {
namespace {

// The [T, T] additive causal mask (0 on and below the diagonal, -inf
// above) in the cache, rebuilt when T, the dtype or the device changes.
const at::Tensor& cached_causal_bias(at::Tensor* cache, int64_t T, const at::Tensor& like) {
  at::Tensor& bias = *cache;
  if (!bias.defined() || bias.size(0) != T || bias.scalar_type() != like.scalar_type() ||
      bias.device() != like.device()) {
    at::NoGradGuard no_grad;
    bias = at::full({T, T}, -std::numeric_limits<float>::infinity(), like.options()).triu_(1);  // [T, T]
  }
  return bias;
}

// q, k or v (which 0, 1, 2) of qkv [B, T, 3*H*D] as a [B, H, T, D] view.
at::Tensor head_view(const at::Tensor& qkv, int64_t which, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * H);
  return qkv.view({B, T, 3, H, D}).select(2, which).permute({0, 2, 1, 3});
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The strided core's softmax: fused_kernels.h's causal one (the default),
// or with DTRAIN_CAUSAL_SOFTMAX=0 the additive -inf bias in the score GEMM
// and ATen's softmax (for A/B runs).
bool causal_softmax_on() {
  static const bool on = !switched_off("DTRAIN_CAUSAL_SOFTMAX");
  return on;
}

// Inputs qkv [B, T, 3C] (contiguous) and the [T, T] causal bias (read only
// with DTRAIN_CAUSAL_SOFTMAX=0); output [B, T, C]. Per batch row b, each
// product is one batch of H GEMMs on strided views (bmm and baddbmm take a
// row stride >= the row length; an output that is not contiguous is
// written head by head, in place). The GEMMs are naive_attention's and its
// autograd's (baddbmm's alpha as the backward's scale); the softmax is
// fused_kernels.h's causal one, which reads each row up to its diagonal
// only (no bias added to the scores) and applies the scale itself.
struct StridedAttention : public torch::autograd::Function<StridedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& bias, int64_t heads) {
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = heads, D = C / H;
    const double scale = 1.0 / std::sqrt(double(D));
    const at::Tensor q = head_view(qkv, 0, H), k = head_view(qkv, 1, H), v = head_view(qkv, 2, H);
    at::Tensor att = at::empty({B, H, T, T}, qkv.options());  // scores, then probabilities
    if (causal_softmax_on()) {
      // q k^T unscaled and unmasked (one bmm per row b), then the causal
      // softmax of scale x scores in place: the mask is each row's length,
      // so the entries above the diagonal are computed but never read.
      for (int64_t b = 0; b < B; ++b) {
        at::Tensor att_b = att[b];
        at::bmm_out(att_b, q[b], k[b].transpose(1, 2));
      }
      kernels::causal_softmax_forward(att.data_ptr<float>(), att.data_ptr<float>(), B * H * T, T, float(scale));
    } else {
      const at::Tensor bias_h = bias.expand({H, T, T});
      for (int64_t b = 0; b < B; ++b) {
        at::Tensor att_b = att[b];
        at::baddbmm_out(att_b, bias_h, q[b], k[b].transpose(1, 2), /*beta=*/1.0, /*alpha=*/scale);
      }
      att = at::softmax(att, /*dim=*/-1);
    }
    at::Tensor y = at::empty({B, T, C}, qkv.options());
    const at::Tensor y_heads = y.view({B, T, H, D}).permute({0, 2, 1, 3});  // [B, H, T, D] view
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor y_b = y_heads[b];
      at::bmm_out(y_b, att[b], v[b]);
    }
    ctx->saved_data["heads"] = heads;
    ctx->save_for_backward({qkv, att});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& qkv = saved[0];
    const at::Tensor& att = saved[1];  // [B, H, T, T] probabilities
    const int64_t H = ctx->saved_data["heads"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / H;
    const double scale = 1.0 / std::sqrt(double(D));
    const at::Tensor dy = grads[0].contiguous();
    const at::Tensor dy_heads = dy.view({B, T, H, D}).permute({0, 2, 1, 3});
    const at::Tensor q = head_view(qkv, 0, H), k = head_view(qkv, 1, H), v = head_view(qkv, 2, H);
    at::Tensor dqkv = at::empty_like(qkv);  // every element written below
    const at::Tensor dq = head_view(dqkv, 0, H), dk = head_view(dqkv, 1, H), dv = head_view(dqkv, 2, H);
    at::Tensor datt = at::empty({B, H, T, T}, qkv.options());
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor datt_b = datt[b], dv_b = dv[b];
      at::bmm_out(datt_b, dy_heads[b], v[b].transpose(1, 2));
      at::bmm_out(dv_b, att[b].transpose(1, 2), dy_heads[b]);
    }
    at::Tensor ds;
    if (causal_softmax_on()) {
      kernels::causal_softmax_backward(datt.data_ptr<float>(), att.data_ptr<float>(), datt.data_ptr<float>(),
                                       B * H * T, T);
      ds = datt;
    } else {
      ds = at::_softmax_backward_data(datt, att, /*dim=*/-1, att.scalar_type());
    }
    for (int64_t b = 0; b < B; ++b) {
      // beta 0: the (unset) output is not read.
      at::Tensor dq_b = dq[b], dk_b = dk[b];
      at::baddbmm_out(dq_b, dq_b, ds[b], k[b], /*beta=*/0.0, /*alpha=*/scale);
      at::baddbmm_out(dk_b, dk_b, ds[b].transpose(1, 2), q[b], /*beta=*/0.0, /*alpha=*/scale);
    }
    return {dqkv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

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
  const at::Tensor& bias = cached_causal_bias(causal_bias, T, q);
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

bool strided_attention_applies(const at::Tensor& qkv) {
  static const bool off = switched_off("DTRAIN_STRIDED_ATTENTION");
  return !off && qkv.dim() == 3 && qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat &&
         !at::autocast::is_autocast_enabled(at::kCPU);
}

at::Tensor strided_attention(const at::Tensor& qkv, int64_t heads, at::Tensor* causal_bias) {
  const at::Tensor qkv_c = qkv.contiguous();
  const at::Tensor& bias = cached_causal_bias(causal_bias, qkv_c.size(1), qkv_c);
  return StridedAttention::apply(qkv_c, bias, heads);
}

}  // namespace dtrain::engine::model
