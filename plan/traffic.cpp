// traffic_model_from_spec and the per-axis byte formulas (traffic.h): one
// function per group kind behind a table, so a new axis is one more row
// (cp: the ring's K/V blocks; with cp > 1 the gradients are reduced over
// dp x cp, the dp_cp row, which moves what dp would; MoE experts are
// reduced over edp, the ranks holding the same experts, and route tokens
// over ep). AR(x) = 2(n-1)/n * x rounded down per call (a ring all-reduce
// of x bytes), as comm counts it.
#include "plan/traffic.h"

#include <algorithm>

#include "plan/gpt_params.h"

namespace dtrain::plan {
namespace {

struct Group {
  uint64_t n;      // members
  int stage;       // pipeline rank
  const AxisSizes& m;
  const TrafficModel& t;
  uint64_t all_reduce(uint64_t x) const { return x * 2 * (n - 1) / n; }
  // A rank's tokens: the sequence is split over cp.
  uint64_t tokens() const { return uint64_t(t.micro_batch) * uint64_t(t.seq_len / std::max(1, m.cp)); }
  // One activation, [micro_batch, seq_len / cp, d_model] elements.
  uint64_t act() const { return tokens() * uint64_t(t.d_model) * uint64_t(t.bytes_per_elem); }
  uint64_t micro() const { return uint64_t(std::max(1, t.grad_accum)); }
  // The blocks this pp rank holds: its chunks' global stages c * pp + stage.
  uint64_t stage_blocks() const {
    uint64_t layers = uint64_t(std::max(1, t.layers / m.pp));
    if (!t.stage_layers.empty()) {
      layers = 0;
      for (size_t s = size_t(stage); s < t.stage_layers.size(); s += size_t(m.pp)) layers += uint64_t(t.stage_layers[s]);
    }
    return layers;
  }
  // The MoE blocks among them (blocks l with l % moe_every == 0): the
  // stage's global stages c * pp + stage, their block ranges in order.
  uint64_t stage_moe_blocks() const {
    if (t.experts <= 0 || t.moe_layers <= 0) return 0;
    std::vector<int> per_stage = t.stage_layers;
    if (per_stage.empty()) per_stage.assign(size_t(std::max(1, m.pp)), t.layers / std::max(1, m.pp));
    uint64_t n = 0;
    int first = 0;
    for (size_t s = 0; s < per_stage.size(); first += per_stage[s], ++s)
      if (int(s) % std::max(1, m.pp) == stage)
        for (int l = first; l < first + per_stage[s]; ++l) n += l % std::max(1, t.moe_every) == 0 ? 1 : 0;
    return n;
  }
};

// dp: gradients of one (tp, pp) shard, G = params / (tp*pp) * bytes_per_elem
// (params: the dense ones; a MoE block's router, not an MLP, and no expert),
// all-reduced once per step: AR(G). ZeRO-1/2 (reduce-scatter + all-gather)
// move the same; ZeRO-3 (FSDP) 1.5x that: parameters are all-gathered
// again for backward.
uint64_t dp_bytes(const Group& g) {
  const uint64_t grad = g.t.params / uint64_t(g.m.tp * g.m.pp) * uint64_t(g.t.bytes_per_elem);
  const uint64_t bytes = g.all_reduce(grad);
  return g.t.zero == 3 ? bytes * 3 / 2 : bytes;
}

// tp: per micro-batch, all-reduces of the activation A: 4 per block
// (forward: attention and MLP row-parallel outputs; backward: the grads
// entering qkv and fc) over the blocks of the stage (layers/pp, or its
// parallel.pipeline.layers_per_stage entries); 1 for the vocab-parallel
// embedding (first stage) and 1 for the grad entering the vocab-parallel
// head (last stage); on the last stage the vocab-parallel cross-entropy's 3
// all-reduces (max, sum of exp, target logit) of E = micro_batch * seq_len
// * 4 bytes (fp32 in every precision). Once a step, the fp64 squared grad
// norm (8 bytes). With a = 1 on the first stage, h = 1 on the last (both
// for pp = 1):
//   grad_accum * ((layers/pp * 4 + a + h) * AR(A) + h * 3 * AR(E)) + AR(8);
// pp = 1 is the engine's tp_bytes_sent per step exactly. An MoE block has
// no MLP all-reduces; instead each TP rank routes the same tokens, sends its
// 1/n share to the experts, and all-gathers the shares' expert outputs,
// [top_k, tokens / n, d_model], forward and the share's input gradient,
// [tokens / n, d_model], backward: each (n-1) times its own part, over the
// stage's MoE blocks. With sequence parallelism an MoE block also
// all-gathers its input's positions forward and its output's gradient
// backward: 2 (n-1) x [tokens / n, d_model] more.
uint64_t tp_bytes(const Group& g) {
  const AxisSizes& m = g.m;
  const TrafficModel& t = g.t;
  // The blocks this pp rank holds: its chunks' global stages c * pp + stage.
  uint64_t layers = uint64_t(std::max(1, t.layers / m.pp));
  if (!t.stage_layers.empty()) {
    layers = 0;
    for (size_t s = size_t(g.stage); s < t.stage_layers.size(); s += size_t(m.pp)) layers += uint64_t(t.stage_layers[s]);
  }
  const uint64_t first = g.stage == 0 ? 1 : 0, last = g.stage == m.pp - 1 ? 1 : 0;
  const uint64_t ce = g.tokens() * 4;  // [micro_batch * seq_len / cp] fp32
  const uint64_t moe = g.stage_moe_blocks();
  const uint64_t act = g.act(), share = act / g.n, k = uint64_t(t.top_k);
  const uint64_t moe_gathers = moe * (g.n - 1) * (k * share + share + (t.sequence_parallel ? 2 * share : 0));
  return g.micro() * ((layers * 4 - moe * 2 + first + last) * g.all_reduce(act) + moe_gathers +
                      last * 3 * g.all_reduce(ce)) +
         g.all_reduce(8);
}

// pp: per micro-batch, each of the n-1 stage boundaries carries one
// activation forward and one gradient backward: grad_accum * 2(n-1) * A.
uint64_t pp_bytes(const Group& g) { return g.micro() * 2 * (g.n - 1) * g.act(); }

// cp: ring attention (engine/parallel/context/ring_attention.h), per
// micro-batch and block of the stage: the rank's K and V (kv = [tokens,
// d_model / tp] each, in the activation dtype) passed n - 1 hops forward
// and n - 1 again backward, where each block's dK and dV (fp32) travel with
// it and come home: n hops. The engine's cp bytes are exactly this.
uint64_t cp_bytes(const Group& g) {
  const uint64_t kv = g.act() / uint64_t(g.m.tp), kv32 = kv / uint64_t(g.t.bytes_per_elem) * 4;
  return g.micro() * g.stage_blocks() * (4 * (g.n - 1) * kv + 2 * g.n * kv32);
}

// ep: per micro-batch and MoE block of the stage, four all-to-alls (dispatch and
// combine, forward and backward) of micro_batch * seq_len / tp * top_k rows
// (the rank's token share) of d_model elements, (n-1)/n of them to other
// ranks when the routing is uniform, plus the forward's count exchange of
// (E - E/n) * 8 bytes; once a step, the experts' fp64 squared grad norm
// (8 bytes) all-reduced for clipping. The engine's ep_bytes_sent follows
// the actual routing.
uint64_t ep_bytes(const Group& g) {
  const TrafficModel& t = g.t;
  if (t.moe_layers <= 0) return 0;
  const uint64_t share = g.act() / uint64_t(g.m.tp);  // this rank's tokens under TP
  const uint64_t rows = share * uint64_t(t.top_k) * (g.n - 1) / g.n;
  const uint64_t counts = uint64_t(t.experts - t.experts / int(g.n)) * 8;
  const uint64_t blocks = g.stage_moe_blocks();
  if (blocks == 0) return 0;
  return g.micro() * blocks * (4 * rows + counts) + g.all_reduce(8);
}

// edp: once a step, one all-reduce of the flat fp32 gradients of this
// rank's experts (E / ep per MoE block of the stage) over the n ranks
// holding the same experts (dp x tp x cp / ep of a stage): AR(X) with
// X = stage MoE blocks x E / ep x one expert's parameters x 4 bytes.
uint64_t edp_bytes(const Group& g) {
  const uint64_t experts = uint64_t(g.t.experts / std::max(1, g.m.ep));
  return g.all_reduce(g.stage_moe_blocks() * experts * g.t.expert_params * 4);
}

struct AxisTraffic {
  const char* axis;
  uint64_t (*bytes)(const Group&);
};
constexpr AxisTraffic kAxes[] = {{"dp", dp_bytes}, {"dp_cp", dp_bytes}, {"tp", tp_bytes},
                                 {"pp", pp_bytes},  {"cp", cp_bytes},    {"ep", ep_bytes},
                                 {"edp", edp_bytes}};

}  // namespace

uint64_t axis_bytes_per_step(const std::string& axis, int group_size, int stage, const AxisSizes& sizes,
                             const TrafficModel& traffic) {
  const Group g{uint64_t(std::max(1, group_size)), stage, sizes, traffic};
  for (const AxisTraffic& a : kAxes)
    if (axis == a.axis) return a.bytes(g);
  return 0;
}

// params: the model's dense parameters (gpt_params.h; a MoE block's router
// in place of an MLP); the experts are reduced over edp.
TrafficModel traffic_model_from_spec(const JobSpec& spec) {
  TrafficModel t;
  const ParamCount count = param_count(spec.model);
  t.params = uint64_t(count.dense);
  t.expert_params = uint64_t(expert_numel(spec.model));
  t.moe_every = std::max(1, spec.model.moe.every);
  t.bytes_per_elem = spec.train.precision == Precision::fp32 ? 4 : 2;
  t.zero = spec.parallel.zero;
  t.micro_batch = spec.train.micro_batch;
  t.grad_accum = spec.train.grad_accum;
  t.seq_len = spec.model.seq_len;
  t.d_model = spec.model.d_model;
  t.layers = spec.model.layers;
  t.stage_layers = spec.stage_layers();
  t.moe_layers = spec.model.moe.every >= 1 ? int(moe_block_count(spec.model)) : 0;
  t.experts = spec.model.moe.experts;
  t.top_k = spec.model.moe.top_k;
  t.sequence_parallel = spec.parallel.sequence_parallel && spec.parallel.tp > 1;
  return t;
}

}  // namespace dtrain::plan
