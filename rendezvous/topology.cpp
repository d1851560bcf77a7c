// The cluster model (nodes, devices, NVLink islands) and rank placement on it
// (docs/ARCHITECTURE.md, 'Placement'): which (node, device) each logical rank of the
// common/mesh.h order runs on. Group tiers and bytes are in topology_groups.cpp,
// renderings in topology_render.cpp. Pure functions: no gRPC, no I/O.
#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <sstream>

#include "common/error.h"
#include "common/mesh.h"
#include "rendezvous/topology.h"
#include "rendezvous/topology_detail.h"

namespace dtrain::rendezvous {

int Cluster::total_devices() const {
  int n = 0;
  for (const auto& node : nodes) n += node.devices;
  return n;
}

Cluster make_cluster(int nodes, int devices_per_node, int nvlink_domain, bool gpu) {
  if (nodes < 1 || devices_per_node < 1 || nvlink_domain < 0)
    throw Error(ErrorCode::config,
                "cluster of " + std::to_string(nodes) + " nodes x " +
                    std::to_string(devices_per_node) + " devices (nvlink_domain " +
                    std::to_string(nvlink_domain) + ") is not a cluster",
                "use at least 1 node and 1 device per node, and nvlink_domain >= 0");
  int domain = (gpu && nvlink_domain > 0) ? nvlink_domain : devices_per_node;
  if (domain > devices_per_node && domain % devices_per_node != 0)
    throw Error(ErrorCode::config,
                "cluster.topology.nvlink_domain = " + std::to_string(domain) +
                    " spans nodes of " + std::to_string(devices_per_node) +
                    " devices but is not a multiple of it",
                "use an nvlink_domain that divides " + std::to_string(devices_per_node) +
                    " or is a multiple of it (islands spanning whole nodes, as on NVL72)");
  Cluster c;
  int per_node_islands = (devices_per_node + domain - 1) / domain;  // when domain <= node
  int nodes_per_island = domain / devices_per_node;                 // when domain > node
  for (int n = 0; n < nodes; ++n) {
    NodeInfo node;
    node.host = nodes == 1 ? "localhost" : "node" + std::to_string(n);
    node.devices = devices_per_node;
    node.gpu = gpu;
    for (int d = 0; d < devices_per_node; ++d) {
      if (!gpu) node.island_of_device.push_back(n);
      else if (domain <= devices_per_node)
        node.island_of_device.push_back(n * per_node_islands + d / domain);
      else
        node.island_of_device.push_back(n / nodes_per_island);
    }
    c.nodes.push_back(node);
  }
  return c;
}

namespace detail {

std::vector<Slot> cluster_slots(const Cluster& cluster) {
  // Dense island ids: GPU islands keep their (global) identity across nodes;
  // a CPU node, or a GPU node that reported no islands, is one island.
  std::map<std::pair<int, int>, int> dense;
  std::vector<Slot> slots;
  for (int n = 0; n < static_cast<int>(cluster.nodes.size()); ++n) {
    const NodeInfo& node = cluster.nodes[n];
    bool own = !node.gpu || node.island_of_device.empty();
    if (!own && static_cast<int>(node.island_of_device.size()) != node.devices)
      throw Error(ErrorCode::config,
                  "node " + std::to_string(n) + " (" + node.host + ") has " +
                      std::to_string(node.devices) + " devices but " +
                      std::to_string(node.island_of_device.size()) + " island ids",
                  "report one NVLink island id per local device, or none");
    for (int d = 0; d < node.devices; ++d) {
      std::pair<int, int> key = own ? std::make_pair(1, n) : std::make_pair(0, node.island_of_device[d]);
      auto it = dense.emplace(key, static_cast<int>(dense.size())).first;
      slots.push_back({n, d, it->second, node.gpu});
    }
  }
  return slots;
}

std::vector<int> island_sizes(const std::vector<Slot>& slots) {
  std::vector<int> sizes;
  for (const auto& s : slots) {
    if (s.island >= static_cast<int>(sizes.size())) sizes.resize(s.island + 1, 0);
    ++sizes[s.island];
  }
  return sizes;
}

std::string join_ints(const std::vector<int>& v, const std::string& sep) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? sep : "") << v[i];
  return out.str();
}

}  // namespace detail

namespace {

using detail::Slot;

// Placement works on a three-axis grid in canonical rank order (tp
// innermost, then the stage's replicas, pp outermost): `dp` here is every
// non-tp, non-pp axis of the mesh together (dp x cp). place_ranks maps each
// mesh rank to its canonical rank, so TP stays inside an island and PP
// crosses nodes whatever parallel.order numbers the ranks.
struct Grid {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
};

void check_mesh_fits(const Cluster& cluster, const mesh::Mesh& m) {
  if (m.dp() < 1 || m.tp() < 1 || m.pp() < 1 || m.cp() < 1 || m.ep < 1)
    throw Error(ErrorCode::config, "mesh " + mesh::describe(m) + " has a size below 1",
                "every parallel size must be >= 1");
  if (m.stage_ranks() % m.ep != 0)
    throw Error(ErrorCode::config,
                "ep(" + std::to_string(m.ep) + ") does not divide dp(" + std::to_string(m.dp()) +
                    ") * tp(" + std::to_string(m.tp()) + ")" +
                    (m.cp() > 1 ? " * cp(" + std::to_string(m.cp()) + ")" : std::string()) + " = " +
                    std::to_string(m.stage_ranks()),
                "choose ep dividing dp*tp");
  if (cluster.nodes.empty())
    throw Error(ErrorCode::config, "the cluster has no nodes", "describe at least one node");
  if (m.world() == cluster.total_devices()) return;
  std::vector<int> devs;
  for (const auto& n : cluster.nodes) devs.push_back(n.devices);
  bool uniform = std::all_of(devs.begin(), devs.end(), [&](int d) { return d == devs[0]; });
  std::string have = std::to_string(devs.size()) + " nodes x " +
                     (uniform ? std::to_string(devs[0]) : "[" + detail::join_ints(devs, ", ") + "]") +
                     " devices = " + std::to_string(cluster.total_devices());
  const bool cp = m.cp() > 1;
  throw Error(ErrorCode::config,
              "dp(" + std::to_string(m.dp()) + ") * tp(" + std::to_string(m.tp()) + ") * pp(" +
                  std::to_string(m.pp()) + ")" + (cp ? " * cp(" + std::to_string(m.cp()) + ")" : std::string()) +
                  " = " + std::to_string(m.world()) + " ranks != " + have + " devices of the cluster",
              std::string("make parallel.dp * parallel.tp * parallel.pp") + (cp ? " * parallel.cp" : "") +
                  " equal cluster.nodes x cluster.procs_per_node");
}

// Chunks of tp consecutive slots in (island, node, device) order: the
// physical homes of TP groups. Each chunk stays in one island iff tp divides
// every island size (every device is used, so each island must be a union of
// whole TP groups: that is also the condition for any valid layout to exist).
std::vector<std::vector<int>> tp_units(const std::vector<Slot>& slots, int tp) {
  std::vector<int> order(slots.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Slot &x = slots[a], &y = slots[b];
    return std::tie(x.island, x.node, x.device) < std::tie(y.island, y.node, y.device);
  });
  std::vector<std::vector<int>> units;
  for (size_t i = 0; i < order.size(); i += tp)
    units.emplace_back(order.begin() + i, order.begin() + i + tp);
  return units;
}

// rank -> slot index, given the unit (TP group home) of each (stage, dp) cell.
std::vector<int> ranks_to_slots(const Grid& m, const std::vector<std::vector<int>>& units,
                                const std::vector<int>& unit_of_cell) {
  std::vector<int> slot_of_rank(m.world());
  for (int r = 0; r < m.world(); ++r) slot_of_rank[r] = units[unit_of_cell[r / m.tp]][r % m.tp];
  return slot_of_rank;
}

// PP neighbours (same dp, tp; stages s and s+1) that share a node.
int pp_same_node_pairs(const Grid& m, const std::vector<Slot>& slots,
                       const std::vector<int>& slot_of_rank) {
  int stage = m.dp * m.tp, bad = 0;
  for (int r = 0; r + stage < m.world(); ++r)
    bad += slots[slot_of_rank[r]].node == slots[slot_of_rank[r + stage]].node;
  return bad;
}

int first_node(const std::vector<Slot>& slots, const std::vector<int>& unit) {
  int n = slots[unit[0]].node;
  for (int s : unit) n = std::min(n, slots[s].node);
  return n;
}

// Candidate 2: stages keep their contiguous blocks of units (DP stays local),
// but stage s goes to the blocks of node (s mod #nodes): neighbours alternate nodes.
std::vector<int> round_robin_stages(const Grid& m, const std::vector<Slot>& slots,
                                    const std::vector<std::vector<int>>& units) {
  std::map<int, std::deque<int>> blocks_by_node;  // home node of a stage block -> blocks
  for (int b = 0; b < m.pp; ++b) blocks_by_node[first_node(slots, units[b * m.dp])].push_back(b);
  std::vector<std::deque<int>*> buckets;
  for (auto& kv : blocks_by_node) buckets.push_back(&kv.second);
  std::vector<int> unit_of_cell(m.pp * m.dp);
  size_t next = 0;
  for (int s = 0; s < m.pp; ++s) {
    while (buckets[next % buckets.size()]->empty()) ++next;
    int block = buckets[next % buckets.size()]->front();
    buckets[next % buckets.size()]->pop_front();
    ++next;
    for (int d = 0; d < m.dp; ++d) unit_of_cell[s * m.dp + d] = block * m.dp + d;
  }
  return unit_of_cell;
}

// Candidate 3: units sorted by node, dealt to the (dp, stage) cells in
// column order (pp fastest), even positions first, then odd: two cells next
// to each other in a PP chain get units half the list apart, hence on
// different nodes whenever no node holds more than half the units.
std::vector<int> interleave_units(const Grid& m, const std::vector<Slot>& slots,
                                  const std::vector<std::vector<int>>& units) {
  int cells = m.pp * m.dp;
  std::vector<int> by_node(cells);
  std::iota(by_node.begin(), by_node.end(), 0);
  std::stable_sort(by_node.begin(), by_node.end(), [&](int a, int b) {
    return first_node(slots, units[a]) < first_node(slots, units[b]);
  });
  std::vector<int> unit_of_cell(cells);
  int i = 0;
  for (int parity = 0; parity < 2; ++parity)
    for (int k = parity; k < cells; k += 2) {
      int d = k / m.pp, s = k % m.pp;
      unit_of_cell[s * m.dp + d] = by_node[i++];
    }
  return unit_of_cell;
}

// The first TP group (in the given layout) whose ranks touch two islands, or -1.
int first_split_tp_group(const Grid& m, const std::vector<Slot>& slots,
                         const std::vector<int>& slot_of_rank) {
  for (int g = 0; g < m.world() / m.tp; ++g)
    for (int t = 1; t < m.tp; ++t)
      if (slots[slot_of_rank[g * m.tp + t]].island != slots[slot_of_rank[g * m.tp]].island)
        return g;
  return -1;
}

std::string tp_split_message(const Grid& m, const std::vector<Slot>& slots, int group) {
  std::vector<int> ranks(m.tp);
  std::iota(ranks.begin(), ranks.end(), group * m.tp);
  return "TP group " + std::to_string(group) + " (ranks [" + detail::join_ints(ranks, ", ") +
         "], tp = " + std::to_string(m.tp) + ") would cross NVLink islands: island sizes are [" +
         detail::join_ints(detail::island_sizes(slots), ", ") +
         "], and tp must divide every island size";
}

std::string tp_choices(const std::vector<Slot>& slots) {
  int g = 0;
  for (int s : detail::island_sizes(slots)) g = std::gcd(g, s);
  std::vector<int> divs;
  for (int d = 1; d <= g; ++d)
    if (g % d == 0) divs.push_back(d);
  return "use parallel.tp in {" + detail::join_ints(divs, ", ") +
         "}, larger islands (cluster.topology.nvlink_domain), or --allow-slow";
}

// Layout search: ordered candidates, the first one with no PP neighbours on one
// node wins (DP locality falls from first to last); else the one with fewest.
std::vector<int> choose_layout(const Grid& m, const Cluster& cluster, const std::vector<Slot>& slots,
                               const std::vector<std::vector<int>>& units,
                               std::vector<std::string>& warnings) {
  std::vector<int> identity(m.pp * m.dp);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<int> best = ranks_to_slots(m, units, identity);
  if (m.pp == 1 || cluster.nodes.size() == 1) return best;
  int best_bad = pp_same_node_pairs(m, slots, best);
  for (const auto& cand : {round_robin_stages(m, slots, units), interleave_units(m, slots, units)}) {
    if (best_bad == 0) break;
    std::vector<int> layout = ranks_to_slots(m, units, cand);
    int bad = pp_same_node_pairs(m, slots, layout);
    if (bad < best_bad) {
      best = layout;
      best_bad = bad;
    }
  }
  if (best_bad > 0)
    warnings.push_back(std::to_string(best_bad) +
                       " pipeline neighbour pairs share a node (no layout of this cluster puts "
                       "every PP neighbour on another node while keeping TP groups whole)");
  return best;
}


// The canonical rank (Grid order: tp innermost, the stage's other axes in
// the mesh's order, pp outermost) of every mesh rank.
std::vector<int> canonical_ranks(const mesh::Mesh& m) {
  std::vector<int> canon(static_cast<size_t>(m.world()));
  for (int r = 0; r < m.world(); ++r) {
    const mesh::Coord c = mesh::coord_of(m, r);
    int inner = 0;  // mixed radix over the non-tp, non-pp axes, outermost first
    for (int i = mesh::kAxes - 1; i >= 0; --i) {
      mesh::Axis a = m.order[size_t(i)];
      if (a != mesh::Axis::tp && a != mesh::Axis::pp) inner = inner * m.size(a) + c[a];
    }
    canon[size_t(r)] = (c[mesh::Axis::pp] * (m.stage_ranks() / m.tp()) + inner) * m.tp() + c[mesh::Axis::tp];
  }
  return canon;
}

}  // namespace

Placement place_ranks(const Cluster& cluster, const mesh::Mesh& mesh, const TrafficModel& traffic,
                      bool allow_slow) {
  check_mesh_fits(cluster, mesh);
  std::vector<Slot> slots = detail::cluster_slots(cluster);
  const Grid grid{mesh.stage_ranks() / mesh.tp(), mesh.tp(), mesh.pp()};
  auto units = tp_units(slots, grid.tp);
  Placement p;
  p.mesh = mesh;
  std::vector<int> slot_of_canon = choose_layout(grid, cluster, slots, units, p.warnings);
  int split = first_split_tp_group(grid, slots, slot_of_canon);
  if (split >= 0 && !allow_slow)
    throw Error(ErrorCode::config, tp_split_message(grid, slots, split), tp_choices(slots));
  if (split >= 0)
    p.warnings.push_back(tp_split_message(grid, slots, split) +
                         " (allowed by --allow-slow: its all-reduces cross a slower link)");
  const std::vector<int> canon = canonical_ranks(mesh);
  std::vector<int> slot_of_rank(canon.size());
  for (int r = 0; r < mesh.world(); ++r) {
    slot_of_rank[size_t(r)] = slot_of_canon[size_t(canon[size_t(r)])];
    const Slot& s = slots[size_t(slot_of_rank[size_t(r)])];
    p.ranks.push_back({r, s.node, s.device, mesh::coord_of(mesh, r)});
  }
  p.groups = detail::build_groups(p, slots, slot_of_rank, traffic);
  return p;
}

}  // namespace dtrain::rendezvous
