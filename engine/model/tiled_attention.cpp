// tiled_attention (tiled_attention.h): a custom autograd function. Forward
// keeps per query tile the running max m, the running sum l and the
// unnormalised output; it saves q, k, v, the output and lse = m + log(l).
// Backward, per (query tile, key tile) pair on or below the diagonal:
//   P = exp(S - lse)            (the forward's probabilities, recomputed)
//   dV += (P * Z)^T dO          (Z: the dropout multiplier, 0 or 1/(1-p))
//   dP  = (dO V^T) * Z
//   dS  = P * (dP - rowsum(dO * O))
//   dQ += dS K / sqrt(D),  dK += dS^T Q / sqrt(D)
//
// Shape legend: BH = batch rows x local heads, T = time, D = head dim,
// ti / tj = a query / key tile's length.
#include "engine/model/tiled_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernel works in fp32 with its own casts: autocast must not turn its
// matmuls into bf16 ones.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

// The causal mask of tile (i0.., j0..) as a [ti, tj] bool (true = masked:
// key j0 + c after query i0 + r), or undefined when no element is masked.
at::Tensor causal_tile_mask(int64_t i0, int64_t ti, int64_t j0, int64_t tj, const at::Tensor& like) {
  if (j0 + tj - 1 <= i0) return {};
  return at::ones({ti, tj}, like.options().dtype(at::kBool)).triu_(i0 - j0 + 1);
}

// The dropout multipliers of tile (i0.., j0..) for every local (row, head):
// [BH, ti, tj], the same values naive_attention draws for those elements.
at::Tensor dropout_tile(const AttentionDropout& d, int64_t batch, int64_t heads, int64_t T, int64_t i0, int64_t ti,
                        int64_t j0, int64_t tj, const at::Tensor& like) {
  at::Tensor z = random::dropout_keep_mask(
      d.key, {d.global_rows, d.heads_global, T, T},
      {{d.row_begin, d.row_begin + batch}, {d.head_begin, d.head_begin + heads}, {i0, i0 + ti}, {j0, j0 + tj}},
      d.p, like.device());  // [B, H, ti, tj]
  return z.view({batch * heads, ti, tj});
}

// Scores of one tile, scaled and causally masked: [BH, ti, tj] fp32.
at::Tensor tile_scores(const at::Tensor& qi, const at::Tensor& kj, double scale, int64_t i0, int64_t j0) {
  at::Tensor s = qi.bmm(kj.transpose(1, 2)).mul_(scale);
  at::Tensor masked = causal_tile_mask(i0, qi.size(1), j0, kj.size(1), s);
  if (masked.defined()) s.masked_fill_(masked, -std::numeric_limits<float>::infinity());
  return s;
}

AttentionDropout dropout_from(AutogradContext* ctx) {
  AttentionDropout d;
  d.p = ctx->saved_data["p"].toDouble();
  d.key.seed = uint64_t(ctx->saved_data["seed"].toInt());
  d.key.step = ctx->saved_data["step"].toInt();
  d.key.layer = int(ctx->saved_data["layer"].toInt());
  d.key.site = random::DropoutSite(ctx->saved_data["site"].toInt());
  d.global_rows = ctx->saved_data["global_rows"].toInt();
  d.row_begin = ctx->saved_data["row_begin"].toInt();
  d.heads_global = ctx->saved_data["heads_global"].toInt();
  d.head_begin = ctx->saved_data["head_begin"].toInt();
  return d;
}

struct TiledAttention : public torch::autograd::Function<TiledAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t batch, const AttentionDropout& d, int64_t tile) {
    NoAutocast no_autocast;
    const at::Tensor q = q_in.to(at::kFloat), k = k_in.to(at::kFloat), v = v_in.to(at::kFloat);
    const int64_t BH = q.size(0), T = q.size(1), D = q.size(2);
    const double scale = 1.0 / std::sqrt(double(D));
    at::Tensor out = at::empty({BH, T, D}, q.options());  // [BH, T, D]
    at::Tensor lse = at::empty({BH, T}, q.options());     // [BH, T]
    for (int64_t i0 = 0; i0 < T; i0 += tile) {
      const int64_t ti = std::min(tile, T - i0);
      const at::Tensor qi = q.narrow(1, i0, ti);                                                   // [BH, ti, D]
      at::Tensor m = at::full({BH, ti}, -std::numeric_limits<float>::infinity(), q.options());     // running max
      at::Tensor l = at::zeros({BH, ti}, q.options());                                             // running sum
      at::Tensor acc = at::zeros({BH, ti, D}, q.options());                                        // unnormalised out
      for (int64_t j0 = 0; j0 < i0 + ti; j0 += tile) {  // key tiles after the last query: all masked, skipped
        const int64_t tj = std::min(tile, T - j0);
        at::Tensor s = tile_scores(qi, k.narrow(1, j0, tj), scale, i0, j0);  // [BH, ti, tj]
        at::Tensor m_new = m.maximum(s.amax(-1));
        at::Tensor p = (s - m_new.unsqueeze(-1)).exp_();  // [BH, ti, tj]
        at::Tensor alpha = (m - m_new).exp_();            // rescales what was summed under the old max
        l.mul_(alpha).add_(p.sum(-1));
        if (d.p > 0.0) p.mul_(dropout_tile(d, batch, BH / batch, T, i0, ti, j0, tj, p));
        acc.mul_(alpha.unsqueeze(-1)).baddbmm_(p, v.narrow(1, j0, tj));
        m = m_new;
      }
      out.narrow(1, i0, ti).copy_(acc.div_(l.unsqueeze(-1)));
      lse.narrow(1, i0, ti).copy_(m + l.log());
    }
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["p"] = d.p;
    ctx->saved_data["seed"] = int64_t(d.key.seed);
    ctx->saved_data["step"] = d.key.step;
    ctx->saved_data["layer"] = int64_t(d.key.layer);
    ctx->saved_data["site"] = int64_t(d.key.site);
    ctx->saved_data["global_rows"] = d.global_rows;
    ctx->saved_data["row_begin"] = d.row_begin;
    ctx->saved_data["heads_global"] = d.heads_global;
    ctx->saved_data["head_begin"] = d.head_begin;
    at::Tensor result = out.to(q_in.scalar_type());
    ctx->save_for_backward({q_in, k_in, v_in, result, lse});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor q = saved[0].to(at::kFloat), k = saved[1].to(at::kFloat), v = saved[2].to(at::kFloat);
    const at::Tensor out = saved[3].to(at::kFloat), lse = saved[4];
    const at::Tensor dout = grads[0].to(at::kFloat).contiguous();  // [BH, T, D]
    const int64_t batch = ctx->saved_data["batch"].toInt(), tile = ctx->saved_data["tile"].toInt();
    const AttentionDropout d = dropout_from(ctx);
    const int64_t BH = q.size(0), T = q.size(1), D = q.size(2);
    const double scale = 1.0 / std::sqrt(double(D));
    const at::Tensor delta = (dout * out).sum(-1);  // [BH, T]: rowsum(dO * O) = rowsum(P * dP)
    at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);  // [BH, T, D]
    for (int64_t i0 = 0; i0 < T; i0 += tile) {
      const int64_t ti = std::min(tile, T - i0);
      const at::Tensor qi = q.narrow(1, i0, ti), doi = dout.narrow(1, i0, ti);  // [BH, ti, D]
      const at::Tensor lse_i = lse.narrow(1, i0, ti).unsqueeze(-1), delta_i = delta.narrow(1, i0, ti).unsqueeze(-1);
      at::Tensor dqi = dq.narrow(1, i0, ti);
      for (int64_t j0 = 0; j0 < i0 + ti; j0 += tile) {
        const int64_t tj = std::min(tile, T - j0);
        const at::Tensor kj = k.narrow(1, j0, tj), vj = v.narrow(1, j0, tj);  // [BH, tj, D]
        at::Tensor p = tile_scores(qi, kj, scale, i0, j0).sub_(lse_i).exp_();  // [BH, ti, tj]
        at::Tensor dp = doi.bmm(vj.transpose(1, 2));                            // [BH, ti, tj]
        if (d.p > 0.0) {
          const at::Tensor z = dropout_tile(d, batch, BH / batch, T, i0, ti, j0, tj, p);
          dv.narrow(1, j0, tj).baddbmm_((p * z).transpose(1, 2), doi);
          dp.mul_(z);
        } else {
          dv.narrow(1, j0, tj).baddbmm_(p.transpose(1, 2), doi);
        }
        const at::Tensor ds = p.mul_(dp.sub_(delta_i));  // [BH, ti, tj]
        dqi.baddbmm_(ds, kj, 1.0, scale);
        dk.narrow(1, j0, tj).baddbmm_(ds.transpose(1, 2), qi, 1.0, scale);
      }
    }
    const auto type = saved[0].scalar_type();
    return {dq.to(type), dk.to(type), dv.to(type), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                           const AttentionDropout& drop, int64_t tile) {
  return TiledAttention::apply(q, k, v, batch, drop, tile);
}

}  // namespace dtrain::engine::model
