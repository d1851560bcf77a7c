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
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/model/grouped_rows.h"

namespace dtrain::engine::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace tile {
namespace {

// The causal mask of tile (i0.., j0..) as a [ti, tj] bool (true = masked:
// key j0 + c after query i0 + r), repeated for G grouped heads ([G*ti, tj]),
// or undefined when no element is masked.
at::Tensor causal_tile_mask(int64_t i0, int64_t ti, int64_t j0, int64_t tj, const at::Tensor& like, int64_t G) {
  if (j0 + tj - 1 <= i0) return {};
  at::Tensor m = at::ones({ti, tj}, like.options().dtype(at::kBool)).triu_(i0 - j0 + 1);
  return G == 1 ? m : m.repeat({G, 1});
}

// The dropout multipliers of tile (i0.., j0..) for every local (row, head):
// [BH, ti, tj], the same values naive_attention draws for those elements.
at::Tensor dropout_tile(const TileDropout& td, int64_t i0, int64_t ti, int64_t j0, int64_t tj,
                        const at::Tensor& like) {
  const AttentionDropout& d = *td.drop;
  at::Tensor z = random::dropout_keep_mask(
      d.key, {d.global_rows, d.heads_global, td.T, td.T},
      {{d.row_begin, d.row_begin + td.batch}, {d.head_begin, d.head_begin + td.heads}, {i0, i0 + ti}, {j0, j0 + tj}},
      d.p, like.device());  // [B, H, ti, tj]
  return z.view({td.batch * td.heads / td.groups, td.groups * ti, tj});  // the grouped rows: a view
}

// Scores of one tile, scaled and (when causal) masked: [BH, ti, tj] fp32
// ([BH/G, G*ti, tj] grouped).
at::Tensor tile_scores(const at::Tensor& qi, const at::Tensor& kj, double scale, int64_t i0, int64_t j0,
                       bool causal, int64_t G) {
  at::Tensor s = qi.bmm(kj.transpose(1, 2)).mul_(scale);
  if (!causal) return s;
  at::Tensor masked = causal_tile_mask(i0, qi.size(1) / G, j0, kj.size(1), s, G);
  if (masked.defined()) s.masked_fill_(masked, -std::numeric_limits<float>::infinity());
  return s;
}

}  // namespace

TileState start(int64_t bh, int64_t ti, int64_t d, const at::TensorOptions& options) {
  return {at::full({bh, ti}, -std::numeric_limits<float>::infinity(), options), at::zeros({bh, ti}, options),
          at::zeros({bh, ti, d}, options)};
}

void forward_step(TileState& st, const at::Tensor& qi, const at::Tensor& kj, const at::Tensor& vj, double scale,
                  int64_t i0, int64_t j0, bool causal, const TileDropout& drop) {
  at::Tensor s = tile_scores(qi, kj, scale, i0, j0, causal, drop.groups);  // [BH, ti, tj]
  at::Tensor m_new = st.m.maximum(s.amax(-1));
  at::Tensor p = (s - m_new.unsqueeze(-1)).exp_();  // [BH, ti, tj]
  at::Tensor alpha = (st.m - m_new).exp_();         // rescales what was summed under the old max
  st.l.mul_(alpha).add_(p.sum(-1));
  if (drop.drop->p > 0.0) p.mul_(dropout_tile(drop, i0, qi.size(1) / drop.groups, j0, kj.size(1), p));
  st.acc.mul_(alpha.unsqueeze(-1)).baddbmm_(p, vj);
  st.m = m_new;
}

void finish(TileState& st, at::Tensor out_i, at::Tensor lse_i) {
  out_i.copy_(st.acc.div_(st.l.unsqueeze(-1)));
  lse_i.copy_(st.m + st.l.log());
}

void backward_step(const at::Tensor& qi, const at::Tensor& kj, const at::Tensor& vj, const at::Tensor& doi,
                   const at::Tensor& lse_i, const at::Tensor& delta_i, at::Tensor dqi, at::Tensor dkj,
                   at::Tensor dvj, double scale, int64_t i0, int64_t j0, bool causal, const TileDropout& drop) {
  at::Tensor p = tile_scores(qi, kj, scale, i0, j0, causal, drop.groups).sub_(lse_i).exp_();  // [BH, ti, tj]
  at::Tensor dp = doi.bmm(vj.transpose(1, 2));                                    // [BH, ti, tj]
  if (drop.drop->p > 0.0) {
    const at::Tensor z = dropout_tile(drop, i0, qi.size(1) / drop.groups, j0, kj.size(1), p);
    dvj.baddbmm_((p * z).transpose(1, 2), doi);
    dp.mul_(z);
  } else {
    dvj.baddbmm_(p.transpose(1, 2), doi);
  }
  const at::Tensor ds = p.mul_(dp.sub_(delta_i));  // [BH, ti, tj]
  dqi.baddbmm_(ds, kj, 1.0, scale);
  dkj.baddbmm_(ds.transpose(1, 2), qi, 1.0, scale);
}

void save_dropout(AutogradContext* ctx, const AttentionDropout& d) {
  ctx->saved_data["p"] = d.p;
  ctx->saved_data["seed"] = int64_t(d.key.seed);
  ctx->saved_data["step"] = d.key.step;
  ctx->saved_data["layer"] = int64_t(d.key.layer);
  ctx->saved_data["site"] = int64_t(d.key.site);
  ctx->saved_data["global_rows"] = d.global_rows;
  ctx->saved_data["row_begin"] = d.row_begin;
  ctx->saved_data["heads_global"] = d.heads_global;
  ctx->saved_data["head_begin"] = d.head_begin;
}

AttentionDropout load_dropout(AutogradContext* ctx) {
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

namespace {
// t [BH, T, ...] viewed per k, v row: [BH/G, G, T, ...].
at::Tensor per_kv_row(const at::Tensor& t, int64_t G) {
  std::vector<int64_t> shape = {t.size(0) / G, G};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return t.view(shape);
}
}  // namespace

at::Tensor group_rows(const at::Tensor& t, int64_t G, int64_t i0, int64_t ti) {
  if (G == 1) return t.narrow(1, i0, ti);
  std::vector<int64_t> shape = {t.size(0) / G, G * ti};
  for (int64_t d = 2; d < t.dim(); ++d) shape.push_back(t.size(d));
  return per_kv_row(t, G).narrow(2, i0, ti).reshape(shape);
}

void ungroup_rows(at::Tensor& t, int64_t G, int64_t i0, int64_t ti, const at::Tensor& tile) {
  at::Tensor dst = per_kv_row(t, G).narrow(2, i0, ti);
  dst.copy_(tile.view(dst.sizes()));
}

}  // namespace tile

namespace {

using tile::group_rows;
using tile::ungroup_rows;

struct TiledAttention : public torch::autograd::Function<TiledAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t batch, const AttentionDropout& d, int64_t tile) {
    tile::NoAutocast no_autocast;
    const at::Tensor q = q_in.to(at::kFloat), k = k_in.to(at::kFloat), v = v_in.to(at::kFloat);
    const int64_t BH = q.size(0), T = q.size(1), D = q.size(2);
    const double scale = 1.0 / std::sqrt(double(D));
    const int64_t G = BH / k.size(0), BKV = k.size(0);  // query heads per k, v row
    const tile::TileDropout td{&d, batch, BH / batch, T, G};
    at::Tensor out = at::empty({BH, T, D}, q.options());  // [BH, T, D]
    at::Tensor lse = at::empty({BH, T}, q.options());     // [BH, T]
    for (int64_t i0 = 0; i0 < T; i0 += tile) {
      const int64_t ti = std::min(tile, T - i0);
      const at::Tensor qi = group_rows(q, G, i0, ti);  // [BKV, G*ti, D]
      tile::TileState st = tile::start(BKV, G * ti, D, q.options());
      for (int64_t j0 = 0; j0 < i0 + ti; j0 += tile) {  // key tiles after the last query: all masked, skipped
        const int64_t tj = std::min(tile, T - j0);
        tile::forward_step(st, qi, k.narrow(1, j0, tj), v.narrow(1, j0, tj), scale, i0, j0, true, td);
      }
      if (G == 1) {
        tile::finish(st, out.narrow(1, i0, ti), lse.narrow(1, i0, ti));
        continue;
      }
      at::Tensor out_i = at::empty({BKV, G * ti, D}, q.options()), lse_i = at::empty({BKV, G * ti}, q.options());
      tile::finish(st, out_i, lse_i);
      ungroup_rows(out, G, i0, ti, out_i);
      ungroup_rows(lse, G, i0, ti, lse_i);
    }
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["tile"] = tile;
    tile::save_dropout(ctx, d);
    at::Tensor result = out.to(q_in.scalar_type());
    ctx->save_for_backward({q_in, k_in, v_in, result, lse});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    tile::NoAutocast no_autocast;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor q = saved[0].to(at::kFloat), k = saved[1].to(at::kFloat), v = saved[2].to(at::kFloat);
    const at::Tensor out = saved[3].to(at::kFloat), lse = saved[4];
    const at::Tensor dout = grads[0].to(at::kFloat).contiguous();  // [BH, T, D]
    const int64_t batch = ctx->saved_data["batch"].toInt(), tile = ctx->saved_data["tile"].toInt();
    const AttentionDropout d = tile::load_dropout(ctx);
    const int64_t BH = q.size(0), T = q.size(1), D = q.size(2);
    const double scale = 1.0 / std::sqrt(double(D));
    const int64_t G = BH / k.size(0), BKV = k.size(0);
    const tile::TileDropout td{&d, batch, BH / batch, T, G};
    const at::Tensor delta = (dout * out).sum(-1);  // [BH, T]: rowsum(dO * O) = rowsum(P * dP)
    at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);  // [BH, T, D], k, v [BKV, T, D]
    for (int64_t i0 = 0; i0 < T; i0 += tile) {
      const int64_t ti = std::min(tile, T - i0);
      const at::Tensor qi = group_rows(q, G, i0, ti), doi = group_rows(dout, G, i0, ti);  // [BKV, G*ti, D]
      const at::Tensor lse_i = group_rows(lse, G, i0, ti).unsqueeze(-1);
      const at::Tensor delta_i = group_rows(delta, G, i0, ti).unsqueeze(-1);
      at::Tensor dqi = G == 1 ? dq.narrow(1, i0, ti) : at::zeros({BKV, G * ti, D}, q.options());
      for (int64_t j0 = 0; j0 < i0 + ti; j0 += tile) {
        const int64_t tj = std::min(tile, T - j0);
        tile::backward_step(qi, k.narrow(1, j0, tj), v.narrow(1, j0, tj), doi, lse_i, delta_i, dqi,
                            dk.narrow(1, j0, tj), dv.narrow(1, j0, tj), scale, i0, j0, true, td);
      }
      if (G > 1) ungroup_rows(dq, G, i0, ti, dqi);
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
