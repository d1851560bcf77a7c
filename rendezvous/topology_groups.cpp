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
  const Mesh& m = placement.mesh;
  mesh::Shape shape{m.dp, m.tp, m.pp, m.ep};
  std::vector<std::string> axes = {"tp", "dp", "pp"};
  if (m.ep > 1) axes.push_back("ep");
  std::vector<Group> groups;
  for (const auto& axis : axes)
    for (auto& ranks : mesh::axis_groups(shape, axis)) {
      Group g;
      g.axis = axis;
      g.tier = group_tier(ranks, slots, slot_of_rank);
      int stage = mesh::coord_of(shape, ranks[0]).pp;  // every member is in one stage, except on "pp"
      g.bytes_per_step = plan::axis_bytes_per_step(axis, static_cast<int>(ranks.size()), stage,
                                                   {m.dp, m.tp, m.pp, m.ep}, traffic);
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
  return make_cluster(nodes, c.procs_per_node, c.topology.nvlink_domain, c.device == "cuda");
}

Mesh mesh_from_spec(const JobSpec& spec) {
  Mesh m;
  m.dp = spec.parallel.dp;
  m.tp = spec.parallel.tp;
  m.pp = spec.parallel.pp;
  m.ep = spec.parallel.ep;
  return m;
}

Placement place_job(const JobSpec& spec, bool allow_slow,
                    const std::vector<std::string>& spec_warnings) {
  Placement p = place_ranks(cluster_from_spec(spec), mesh_from_spec(spec),
                            traffic_model_from_spec(spec), allow_slow);
  p.warnings.insert(p.warnings.begin(), spec_warnings.begin(), spec_warnings.end());
  return p;
}

}  // namespace dtrain::rendezvous
