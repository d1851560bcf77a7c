// The groups of a placement (one per mesh axis slice), the link tier each
// crosses and the bytes each moves per training step (plan/traffic.h's
// formulas); plus the adapters from the job spec (cluster, mesh). Placement itself is in
// topology.cpp; text/JSON/SVG in topology_render.cpp.
#include <algorithm>

#include "common/job_spec.h"
#include "common/mesh.h"
#include "plan/traffic.h"
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

}  // namespace

std::vector<Group> build_groups(const Placement& placement, const std::vector<Slot>& slots,
                                const std::vector<int>& slot_of_rank, const TrafficModel& traffic) {
  const mesh::Mesh& m = placement.mesh;
  // The groups that carry traffic: with cp, gradients are reduced over
  // dp x cp (dp_cp) and the cp group carries the ring's K/V blocks; a MoE
  // model's experts are reduced over edp.
  using K = mesh::GroupKind;
  std::vector<K> kinds = {K::tp, K::dp, K::pp};
  if (m.cp() > 1) kinds = {K::tp, K::cp, K::dp_cp, K::pp};
  if (m.ep > 1) kinds.push_back(K::ep);
  if (traffic.experts > 0 && traffic.moe_layers > 0) kinds.push_back(K::edp);  // the experts' gradients
  std::vector<Group> groups;
  for (K kind : kinds)
    for (auto& ranks : mesh::groups(m, kind)) {
      Group g;
      g.axis = mesh::group_name(kind);
      g.tier = group_tier(ranks, slots, slot_of_rank);
      int stage = mesh::coord_of(m, ranks[0])[mesh::Axis::pp];  // every member is in one stage, except on "pp"
      g.bytes_per_step = plan::axis_bytes_per_step(g.axis, static_cast<int>(ranks.size()), stage,
                                                   {m.dp(), m.tp(), m.pp(), m.ep, m.cp()}, traffic);
      g.ranks = std::move(ranks);
      groups.push_back(std::move(g));
    }
  return groups;
}

}  // namespace detail

Cluster cluster_from_spec(const JobSpec& spec) {
  const ClusterSpec& c = spec.cluster;
  int nodes = c.nodes_max;
  if (nodes * c.procs_per_node != spec.world() && c.nodes_min * c.procs_per_node == spec.world())
    nodes = c.nodes_min;
  return make_cluster(nodes, c.procs_per_node, c.topology.nvlink_domain, c.device == DeviceKind::cuda);
}

Placement place_job(const JobSpec& spec, bool allow_slow,
                    const std::vector<std::string>& spec_warnings) {
  Placement p = place_ranks(cluster_from_spec(spec), spec.mesh(),
                            traffic_model_from_spec(spec), allow_slow);
  p.warnings.insert(p.warnings.begin(), spec_warnings.begin(), spec_warnings.end());
  return p;
}

}  // namespace dtrain::rendezvous
