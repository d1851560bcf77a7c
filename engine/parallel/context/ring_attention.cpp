// ring_attention (ring_attention.h): a custom autograd function over the
// tiled kernel's steps. Rank r's queries are its chunks r and 2N-1-r; at
// ring step s it holds the K/V block of rank o = r - s (mod N), chunks o and
// 2N-1-o. Per (query chunk, key chunk): key chunk before the query chunk:
// every key precedes every query, unmasked; the same chunk: the causal
// diagonal; after: skipped. Step 0 is the rank's own block, so every query
// row sees its diagonal key in the first tile that reaches it.
//
// Forward: the next block's send/recv is posted before computing on the
// current one (two buffers), so transfer overlaps compute. Backward: K/V go
// round again; each block's dK, dV accumulator travels with it: rank r adds
// its share, sends it on, and after N hops the accumulator is back with the
// block's owner. The share is computed before the incoming accumulator is
// awaited, so that transfer overlaps compute too.
//
// No deadlock: every send and recv is posted without waiting, and a rank
// at step s waits only for transfers that its peers post at step s (K/V,
// posted before their compute) or at step s-1 (accumulators).
//
// Grouped-query attention: k, v have BKV = BH / G rows (G query heads per
// k, v head) and travel un-repeated; each query tile is grouped as the tiled
// kernel groups it ([BKV, G*ti, D], tile::group_rows) for the whole ring.
//
// Shape legend: BH = batch rows x local heads, BKV = batch rows x local kv
// heads, G = BH / BKV, Tl = local length, c = Tl/2 (one chunk), D = head dim.
#include "engine/parallel/context/ring_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "engine/model/grouped_rows.h"
#include "engine/parallel/context/cp_layout.h"

namespace dtrain::engine::parallel::context {
namespace {

namespace tile = model::tile;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One tile of a rank's two chunks: where it lies in the local tensor and in
// the global sequence, and which global chunk holds it.
struct Span {
  int64_t local, len, global, chunk;
};

// The tiles of rank `owner`'s chunks, in local order; tiles never cross a
// chunk, so each has contiguous global positions (the last of a chunk may
// be short).
std::vector<Span> chunk_tiles(int64_t c, int n, int owner, int64_t tile_len) {
  std::vector<Span> spans;
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t chunk = half == 0 ? owner : 2 * int64_t{n} - 1 - owner;
    for (int64_t t = 0; t < c; t += tile_len)
      spans.push_back({half * c + t, std::min(tile_len, c - t), chunk * c + t, chunk});
  }
  return spans;
}

enum class PairRule { skip, unmasked, diagonal };

PairRule pair_rule(int64_t query_chunk, int64_t key_chunk) {
  if (key_chunk < query_chunk) return PairRule::unmasked;
  if (key_chunk == query_chunk) return PairRule::diagonal;
  return PairRule::skip;
}

// Calls fn(query tile index, query span, key span, causal) for every pair
// of tiles that causal attention reads.
template <class Fn>
void for_each_pair(const std::vector<Span>& queries, const std::vector<Span>& keys, Fn&& fn) {
  for (size_t i = 0; i < queries.size(); ++i)
    for (const Span& ks : keys) {
      const PairRule rule = pair_rule(queries[i].chunk, ks.chunk);
      if (rule == PairRule::skip) continue;
      if (rule == PairRule::diagonal && ks.global >= queries[i].global + queries[i].len) continue;  // above it
      fn(i, queries[i], ks, rule == PairRule::diagonal);
    }
}

// Who this rank talks to, and how many blocks it sees.
struct Ring {
  comm::Group* group;
  int n, rank;
  bool active;  // false: one step on the own block, no traffic (N = 1 or local_only)
  int steps() const { return active ? n : 1; }
  int next() const { return (rank + 1) % n; }
  int prev() const { return (rank + n - 1) % n; }
  int owner(int step) const { return (rank + n - step) % n; }
};

// The K/V block [2, BKV, Tl, D] this rank holds, and the transfer of the
// next one into a second buffer (double buffering).
class KvRing {
 public:
  KvRing(const Ring& ring, at::Tensor kv) : ring_(ring), kv_(std::move(kv)) {}
  const at::Tensor& current() const { return kv_; }
  // Posts the send of the current block to next and the recv of the next
  // block from prev; nothing after the last step.
  void post(int step) {
    if (step + 1 >= ring_.steps()) return;
    if (!spare_.defined()) spare_ = at::empty_like(kv_);
    send_ = ring_.group->send(kv_, ring_.next(), kRingKvTag);
    recv_ = ring_.group->recv(spare_, ring_.prev(), kRingKvTag);
  }
  // Waits for both; the received block becomes current, the sent buffer spare.
  void advance() {
    if (!send_) return;
    send_->wait();
    recv_->wait();
    send_.reset();
    recv_.reset();
    std::swap(kv_, spare_);
  }

 private:
  Ring ring_;
  at::Tensor kv_, spare_;
  comm::WorkPtr send_, recv_;
};

// Throws dtrain::Error(internal) naming what does not fit.
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch, int64_t tile_len) {
  const bool ok = q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && k.size(1) == q.size(1) &&
                  k.size(2) == q.size(2) && q.size(1) % 2 == 0 && batch > 0 && k.size(0) > 0 &&
                  k.size(0) % batch == 0 && q.size(0) % k.size(0) == 0 && tile_len > 0;
  if (!ok)
    throw Error(ErrorCode::internal,
                "ring_attention: q " + c10::str(q.sizes()) + ", k " + c10::str(k.sizes()) + ", v " +
                    c10::str(v.sizes()) + ", batch " + std::to_string(batch) + ", tile " + std::to_string(tile_len) +
                    ": needs q [B*H, Tl, D] and k, v [B*KV, Tl, D] with KV dividing H, Tl even (two chunks), "
                    "tile > 0");
}

struct RingAttention : public torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t batch, const model::AttentionDropout& d,
                            comm::Group* cp, int64_t tile_len, bool local_only) {
    tile::NoAutocast no_autocast;
    check_inputs(q_in, k_in, v_in, batch, tile_len);
    const at::Tensor q = q_in.to(at::kFloat);
    const int64_t BH = q.size(0), Tl = q.size(1), D = q.size(2), c = Tl / 2;
    const int64_t BKV = k_in.size(0), G = BH / BKV;
    const Ring ring{cp, cp->size(), cp->rank(), cp->size() > 1 && !local_only};
    const double scale = 1.0 / std::sqrt(double(D));
    const tile::TileDropout td{&d, batch, BH / batch, Tl * ring.n, G};
    const std::vector<Span> queries = chunk_tiles(c, ring.n, ring.rank, tile_len);
    std::vector<tile::TileState> states;  // one online softmax per query tile, across all steps
    std::vector<at::Tensor> qt;           // the query tiles, grouped: [BKV, G*ti, D]
    for (const Span& qs : queries) {
      states.push_back(tile::start(BKV, G * qs.len, D, q.options()));
      qt.push_back(tile::group_rows(q, G, qs.local, qs.len));
    }
    KvRing kv(ring, at::stack({k_in, v_in}).contiguous());  // [2, BKV, Tl, D], the inputs' dtype: what travels
    for (int s = 0; s < ring.steps(); ++s) {
      kv.post(s);
      const at::Tensor kvf = kv.current().to(at::kFloat);  // [2, BKV, Tl, D]
      const at::Tensor k = kvf[0], v = kvf[1];
      for_each_pair(queries, chunk_tiles(c, ring.n, ring.owner(s), tile_len),
                    [&](size_t i, const Span& qs, const Span& ks, bool causal) {
                      tile::forward_step(states[i], qt[i], k.narrow(1, ks.local, ks.len),
                                         v.narrow(1, ks.local, ks.len), scale, qs.global, ks.global, causal, td);
                    });
      kv.advance();
    }
    at::Tensor out = at::empty({BH, Tl, D}, q.options());  // [BH, Tl, D]
    at::Tensor lse = at::empty({BH, Tl}, q.options());     // [BH, Tl]
    for (size_t i = 0; i < queries.size(); ++i) {
      const int64_t at0 = queries[i].local, len = queries[i].len;
      if (G == 1) {
        tile::finish(states[i], out.narrow(1, at0, len), lse.narrow(1, at0, len));
        continue;
      }
      at::Tensor out_i = at::empty({BKV, G * len, D}, q.options()), lse_i = at::empty({BKV, G * len}, q.options());
      tile::finish(states[i], out_i, lse_i);
      tile::ungroup_rows(out, G, at0, len, out_i);
      tile::ungroup_rows(lse, G, at0, len, lse_i);
    }
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["tile"] = tile_len;
    ctx->saved_data["local_only"] = local_only;
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cp));  // outlives the graph
    tile::save_dropout(ctx, d);
    at::Tensor result = out.to(q_in.scalar_type());
    ctx->save_for_backward({q_in, k_in, v_in, result, lse});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    tile::NoAutocast no_autocast;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor q = saved[0].to(at::kFloat), out = saved[3].to(at::kFloat), lse = saved[4];
    const at::Tensor dout = grads[0].to(at::kFloat).contiguous();  // [BH, Tl, D]
    const int64_t batch = ctx->saved_data["batch"].toInt(), tile_len = ctx->saved_data["tile"].toInt();
    auto* cp = reinterpret_cast<comm::Group*>(static_cast<intptr_t>(ctx->saved_data["cp"].toInt()));
    const model::AttentionDropout d = tile::load_dropout(ctx);
    const int64_t BH = q.size(0), Tl = q.size(1), D = q.size(2), c = Tl / 2;
    const int64_t BKV = saved[1].size(0), G = BH / BKV;
    const Ring ring{cp, cp->size(), cp->rank(), cp->size() > 1 && !ctx->saved_data["local_only"].toBool()};
    const double scale = 1.0 / std::sqrt(double(D));
    const tile::TileDropout td{&d, batch, BH / batch, Tl * ring.n, G};
    const std::vector<Span> queries = chunk_tiles(c, ring.n, ring.rank, tile_len);
    const at::Tensor delta = (dout * out).sum(-1);  // [BH, Tl]: rowsum(dO * O)
    at::Tensor dq = at::zeros_like(q);              // [BH, Tl, D]
    // Per query tile, grouped ([BKV, G*ti, ...]): q, dO, lse and delta
    // ([BKV, G*ti, 1]), and dq's accumulator (a view of dq when G = 1).
    std::vector<at::Tensor> qt, dot, lset, deltat, dqt;
    for (const Span& qs : queries) {
      qt.push_back(tile::group_rows(q, G, qs.local, qs.len));
      dot.push_back(tile::group_rows(dout, G, qs.local, qs.len));
      lset.push_back(tile::group_rows(lse, G, qs.local, qs.len).unsqueeze(-1));
      deltat.push_back(tile::group_rows(delta, G, qs.local, qs.len).unsqueeze(-1));
      dqt.push_back(G == 1 ? dq.narrow(1, qs.local, qs.len) : at::zeros({BKV, G * qs.len, D}, q.options()));
    }
    KvRing kv(ring, at::stack({saved[1], saved[2]}).contiguous());
    at::Tensor grad;     // [2, BKV, Tl, D] fp32: dK, dV of the block held at this step
    at::Tensor grad_in;  // the next block's accumulator, arriving from prev
    comm::WorkPtr grad_send, grad_recv;
    for (int s = 0; s < ring.steps(); ++s) {
      kv.post(s);
      const at::Tensor kvf = kv.current().to(at::kFloat);
      const at::Tensor k = kvf[0], v = kvf[1];
      at::Tensor part = at::zeros({2, BKV, Tl, D}, q.options());  // this rank's share of the block's dK, dV
      for_each_pair(queries, chunk_tiles(c, ring.n, ring.owner(s), tile_len),
                    [&](size_t i, const Span& qs, const Span& ks, bool causal) {
                      tile::backward_step(qt[i], k.narrow(1, ks.local, ks.len), v.narrow(1, ks.local, ks.len), dot[i],
                                          lset[i], deltat[i], dqt[i], part[0].narrow(1, ks.local, ks.len),
                                          part[1].narrow(1, ks.local, ks.len), scale, qs.global, ks.global, causal,
                                          td);
                    });
      if (s > 0) {
        grad_recv->wait();  // the earlier ranks' shares of this block
        part.add_(grad_in);
      }
      if (grad_send) grad_send->wait();  // the previous accumulator has left: `grad` may be dropped
      grad = part;
      if (ring.active) {
        grad_send = cp->send(grad, ring.next(), kRingGradTag);
        grad_in = at::empty_like(grad);
        grad_recv = cp->recv(grad_in, ring.prev(), kRingGradTag);  // at the last step: this rank's own block, home
      }
      kv.advance();
    }
    if (ring.active) {
      grad_send->wait();
      grad_recv->wait();
      grad = grad_in;
    }
    if (G > 1)
      for (size_t i = 0; i < queries.size(); ++i) tile::ungroup_rows(dq, G, queries[i].local, queries[i].len, dqt[i]);
    return {dq.to(saved[0].scalar_type()), grad[0].to(saved[1].scalar_type()), grad[1].to(saved[2].scalar_type()),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                          const model::AttentionDropout& drop, comm::Group& cp, const RingOptions& opt) {
  return RingAttention::apply(q, k, v, batch, drop, &cp, opt.tile, opt.local_only);
}

RingBytes ring_attention_bytes(int cp, int64_t bkv, int64_t local_len, int64_t head_dim, int64_t elem_size,
                               bool local_only) {
  if (cp <= 1 || local_only) return {};
  const uint64_t block = static_cast<uint64_t>(2 * bkv * local_len * head_dim);  // K and V (or dK and dV)
  const uint64_t n = static_cast<uint64_t>(cp);
  const uint64_t kv = (n - 1) * block * static_cast<uint64_t>(elem_size);
  return {kv, kv + n * block * 4};
}

}  // namespace dtrain::engine::parallel::context
