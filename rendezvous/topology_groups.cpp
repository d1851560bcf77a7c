// The groups of a placement (one per mesh axis slice), the link tier each
// crosses and the bytes each moves per training step; plus the adapters from
// the job spec (cluster, mesh, traffic inputs). Placement itself is in
// topology.cpp; text/JSON/SVG in topology_render.cpp.
#include <algorithm>

#include "common/job_spec.h"
#include "common/mesh.h"
#include "rendezvous/topology.h"
#include "rendezvous/topology_detail.h"

namespace dtrain::rendezvous {

const char* link_tier_name(LinkTier tier) {
  switch (tier) {
    case LinkTier::nvlink: return "nvlink";
    case LinkTier::loopback: return "loopback";
    case LinkTier::pcie: return "pcie";
    case LinkTier::ib: return "ib";
  }
  return "unknown";
}

int tier_slowness(LinkTier tier) {
  switch (tier) {
    case LinkTier::nvlink: return 0;
    case LinkTier::loopback: return 1;
    case LinkTier::pcie: return 2;
    case LinkTier::ib: return 3;
  }
  return 3;
}

namespace detail {

LinkTier link_between(const Slot& a, const Slot& b) {
  bool gpu = a.gpu && b.gpu;
  if (a.island == b.island) return gpu ? LinkTier::nvlink : LinkTier::loopback;
  if (a.node == b.node) return gpu ? LinkTier::pcie : LinkTier::loopback;
  return LinkTier::ib;
}

namespace {

// The slowest link between any two members: one island -> nvlink (GPU; the
// island may span nodes, as on NVL72) or loopback (a CPU node is one island);
// one node but two islands -> pcie; two nodes -> ib (the network tier).
LinkTier group_tier(const std::vector<int>& ranks, const std::vector<Slot>& slots,
                    const std::vector<int>& slot_of_rank) {
  const Slot& first = slots[slot_of_rank[ranks[0]]];
  bool one_island = true, one_node = true, all_gpu = true;
  for (int r : ranks) {
    const Slot& s = slots[slot_of_rank[r]];
    one_island = one_island && s.island == first.island;
    one_node = one_node && s.node == first.node;
    all_gpu = all_gpu && s.gpu;
  }
  if (!one_node && !one_island) return LinkTier::ib;
  if (one_island) return all_gpu ? LinkTier::nvlink : LinkTier::loopback;
  return all_gpu ? LinkTier::pcie : LinkTier::loopback;
}

// Bytes per training step that each member of a group of n sends, by axis.
//   ring all-reduce of X bytes: 2(n-1)/n * X.
//   dp: gradients of one (tp, pp) shard, G = params / (tp*pp) * bytes_per_elem,
//       all-reduced once per step: 2(n-1)/n * G. ZeRO-1/2 (reduce-scatter +
//       all-gather) move the same; ZeRO-3 (FSDP) 1.5x that: parameters are
//       all-gathered again for backward.
//   tp: per micro-batch, all-reduces of the activation
//       A = micro_batch * seq_len * d_model * bytes_per_elem: 4 per block
//       (forward: attention and MLP row-parallel outputs; backward: the
//       grads entering qkv and fc) over the blocks of the stage (layers/pp, or its
//       parallel.pipeline.layers_per_stage entries);
//       1 for the vocab-parallel embedding (first stage) and 1 for the grad
//       entering the vocab-parallel head (last stage); on the last stage the
//       vocab-parallel cross-entropy's 3 all-reduces (max, sum of exp, target
//       logit) of E = micro_batch * seq_len * 4 bytes (counted as fp32 in
//       every precision). Once a step, the fp64 squared grad norm (8 bytes).
//       With a = 1 on the first stage, h = 1 on the last (both for pp = 1):
//       grad_accum * ((layers/pp * 4 + a + h) * AR(A) + h * 3 * AR(E)) + AR(8),
//       AR(x) = 2(n-1)/n * x rounded down per call, as comm counts it.
//       pp = 1 is the engine's tp_bytes_sent per step exactly.
//       An MoE block has no MLP all-reduces; instead each TP rank routes the
//       same tokens, sends its 1/n share to the experts, and all-gathers the
//       shares' expert outputs, [top_k, tokens / n, d_model], forward and
//       the share's input gradient, [tokens / n, d_model], backward: each
//       (n-1) times its own part (MoE runs with pp = 1 only).
//   pp: per micro-batch, each of the n-1 stage boundaries carries one
//       activation forward and one gradient backward: grad_accum * 2(n-1) * A.
//   cp: per micro-batch and block, ring attention's K/V (the rank's
//       tokens x d_model / tp each) n - 1 hops forward and n - 1 backward,
//       plus the fp32 dK/dV travelling with them, n hops (home included).
//       dp_cp carries dp's gradient formula over dp x cp ranks.
//   ep: per micro-batch and MoE layer, four all-to-alls (dispatch and
//       combine, forward and backward) of micro_batch * seq_len / tp * top_k
//       rows (the rank's token share) of d_model elements, (n-1)/n of them
//       to other ranks when the routing is uniform, plus the forward's count
//       exchange of (E - E/n) * 8 bytes; once a step, the experts' fp64
//       squared grad norm (8 bytes) all-reduced for clipping.
//       The engine's ep_bytes_sent follows the actual routing.
uint64_t group_bytes(const std::string& axis, int n, int stage, const mesh::Mesh& m, const TrafficModel& t) {
  auto all_reduce = [n](uint64_t x) { return x * 2 * static_cast<uint64_t>(n - 1) / n; };
  uint64_t elem = static_cast<uint64_t>(t.bytes_per_elem);
  // A rank's tokens: the sequence is split over cp.
  uint64_t act = static_cast<uint64_t>(t.micro_batch) * (t.seq_len / m.cp()) * t.d_model * elem;
  uint64_t micro = static_cast<uint64_t>(std::max(1, t.grad_accum));
  if (axis == "dp" || axis == "dp_cp") {
    uint64_t grad = t.params / static_cast<uint64_t>(m.tp() * m.pp()) * elem;
    uint64_t bytes = all_reduce(grad);
    return t.zero == 3 ? bytes * 3 / 2 : bytes;
  }
  if (axis == "tp") {
    // The blocks this pp rank holds: its chunks' global stages c * pp + stage.
    uint64_t layers = static_cast<uint64_t>(std::max(1, t.layers / m.pp()));
    if (!t.stage_layers.empty()) {
      layers = 0;
      for (size_t s = static_cast<size_t>(stage); s < t.stage_layers.size(); s += static_cast<size_t>(m.pp()))
        layers += static_cast<uint64_t>(t.stage_layers[s]);
    }
    uint64_t first = stage == 0 ? 1 : 0, last = stage == m.pp() - 1 ? 1 : 0;
    uint64_t ce = static_cast<uint64_t>(t.micro_batch) * (t.seq_len / m.cp()) * 4;  // [micro_batch * seq_len] fp32
    const uint64_t moe = m.pp() == 1 ? static_cast<uint64_t>(t.moe_layers) : 0;
    const uint64_t share = act / static_cast<uint64_t>(n), k = static_cast<uint64_t>(t.top_k);
    const uint64_t moe_gathers = moe * static_cast<uint64_t>(n - 1) * (k * share + share);
    return micro * ((layers * 4 - moe * 2 + first + last) * all_reduce(act) + moe_gathers +
                    last * 3 * all_reduce(ce)) +
           all_reduce(8);
  }
  if (axis == "pp") return micro * 2 * static_cast<uint64_t>(n - 1) * act;
  if (axis == "cp") {
    // Ring attention, per micro-batch and block of this stage: the rank's K
    // and V (kv = [tokens, d_model / tp] each, in the activation dtype)
    // passed n - 1 times forward and again backward, where each block's dK
    // and dV (fp32) travel with it and come home: n hops.
    const uint64_t kv = act / static_cast<uint64_t>(m.tp()), kv32 = kv / elem * 4;
    uint64_t layers = static_cast<uint64_t>(std::max(1, t.layers / m.pp()));
    if (!t.stage_layers.empty()) {
      layers = 0;
      for (size_t s = static_cast<size_t>(stage); s < t.stage_layers.size(); s += static_cast<size_t>(m.pp()))
        layers += static_cast<uint64_t>(t.stage_layers[s]);
    }
    const uint64_t hops = static_cast<uint64_t>(n - 1);
    return micro * layers * (4 * hops * kv + 2 * static_cast<uint64_t>(n) * kv32);
  }
  if (axis == "ep" && t.moe_layers > 0) {
    const uint64_t share = act / static_cast<uint64_t>(m.tp());  // this rank's tokens under TP
    const uint64_t rows = share * static_cast<uint64_t>(t.top_k) * static_cast<uint64_t>(n - 1) / n;
    const uint64_t counts = static_cast<uint64_t>(t.experts - t.experts / n) * 8;
    return micro * static_cast<uint64_t>(t.moe_layers) * (4 * rows + counts) + all_reduce(8);
  }
  return 0;
}

}  // namespace

std::vector<Group> build_groups(const Placement& placement, const std::vector<Slot>& slots,
                                const std::vector<int>& slot_of_rank, const TrafficModel& traffic) {
  const mesh::Mesh& m = placement.mesh;
  // The groups that carry traffic: with cp, gradients are reduced over
  // dp x cp (dp_cp) and the cp group carries the ring's K/V blocks.
  using K = mesh::GroupKind;
  std::vector<K> kinds = {K::tp, K::dp, K::pp};
  if (m.cp() > 1) kinds = {K::tp, K::cp, K::dp_cp, K::pp};
  if (m.ep > 1) kinds.push_back(K::ep);
  std::vector<Group> groups;
  for (K kind : kinds)
    for (auto& ranks : mesh::groups(m, kind)) {
      Group g;
      g.axis = mesh::group_name(kind);
      g.tier = group_tier(ranks, slots, slot_of_rank);
      int stage = mesh::coord_of(m, ranks[0])[mesh::Axis::pp];  // every member is in one stage, except on "pp"
      g.bytes_per_step = group_bytes(g.axis, static_cast<int>(ranks.size()), stage, m, traffic);
      g.ranks = std::move(ranks);
      groups.push_back(std::move(g));
    }
  return groups;
}

}  // namespace detail

// GPT parameters (engine/model/gpt.h), V vocab, T seq_len,
// C d_model, L layers: wte V*C + wpe T*C + L blocks + ln_f 2C + head V*C (no
// bias, untied). One block: ln1 2C, qkv 3C*C+3C, attn proj C*C+C, ln2 2C,
// fc 4C*C+4C, mlp proj 4C*C+C = 12C^2 + 13C.
TrafficModel traffic_model_from_spec(const JobSpec& spec) {
  TrafficModel t;
  uint64_t V = spec.model.vocab, T = spec.model.seq_len, C = spec.model.d_model;
  uint64_t L = spec.model.layers;
  t.params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C;
  t.bytes_per_elem = spec.train.precision == "fp32" ? 4 : 2;
  t.zero = spec.parallel.zero;
  t.micro_batch = spec.train.micro_batch;
  t.grad_accum = spec.train.grad_accum;
  t.seq_len = spec.model.seq_len;
  t.d_model = spec.model.d_model;
  t.layers = spec.model.layers;
  t.stage_layers = spec.stage_layers();
  const MoeSpec& moe = spec.model.moe;
  for (int i = 0; moe.experts > 0 && moe.every >= 1 && i < spec.model.layers; ++i) t.moe_layers += i % moe.every == 0;
  t.experts = moe.experts;
  t.top_k = moe.top_k;
  return t;
}

Cluster cluster_from_spec(const JobSpec& spec) {
  const ClusterSpec& c = spec.cluster;
  int nodes = c.nodes_max;
  if (nodes * c.procs_per_node != spec.world() && c.nodes_min * c.procs_per_node == spec.world())
    nodes = c.nodes_min;
  return make_cluster(nodes, c.procs_per_node, c.topology.nvlink_domain, c.device == "cuda");
}

Placement place_job(const JobSpec& spec, bool allow_slow,
                    const std::vector<std::string>& spec_warnings) {
  Placement p = place_ranks(cluster_from_spec(spec), spec.mesh(),
                            traffic_model_from_spec(spec), allow_slow);
  p.warnings.insert(p.warnings.begin(), spec_warnings.begin(), spec_warnings.end());
  return p;
}

}  // namespace dtrain::rendezvous
