// Placement tests (docs/ARCHITECTURE.md, 'Placement'): every factorisation dp x
// tp x pp of 8, 12, 16 and 64 ranks over 1, 2, 3, 4 and 8 nodes and many island
// layouts, checked for the invariants of place_ranks; the bytes formulas on a
// hand-computed case; and `dtrain topo` / `dtrain validate` on every config.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/job_spec.h"
#include "common/mesh.h"
#include "rendezvous/topology.h"
#include "tests/support/child.h"

using namespace dtrain::rendezvous;
using dtrain::Error;
using dtrain::mesh::Mesh;
using dtrain::mesh::make_mesh;
using dtrain::ErrorCode;

namespace {

std::vector<Mesh> factorisations(int world) {
  std::vector<Mesh> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back(make_mesh(world / (tp * pp), tp, pp, 1));
  // Context parallelism: cp 2 beside tp and pp, in the default order and in
  // one where cp is outside dp.
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      if (world % (2 * tp * pp) == 0) {
        out.push_back(make_mesh(world / (2 * tp * pp), tp, pp, 1, 2));
        out.push_back(make_mesh(world / (2 * tp * pp), tp, pp, 1, 2,
                                {dtrain::mesh::Axis::tp, dtrain::mesh::Axis::dp, dtrain::mesh::Axis::cp,
                                 dtrain::mesh::Axis::pp}));
      }
  return out;
}

// Island sizes of a cluster, counted from its island ids (per node for CPUs).
std::vector<int> island_sizes_of(const Cluster& c) {
  std::map<std::pair<int, int>, int> count;
  for (size_t n = 0; n < c.nodes.size(); ++n)
    for (int d = 0; d < c.nodes[n].devices; ++d)
      ++count[c.nodes[n].gpu ? std::make_pair(0, c.nodes[n].island_of_device[d])
                             : std::make_pair(1, static_cast<int>(n))];
  std::vector<int> sizes;
  for (auto& kv : count) sizes.push_back(kv.second);
  return sizes;
}

int island_of(const Cluster& c, const RankPlacement& r) {
  return c.nodes[r.node].gpu ? c.nodes[r.node].island_of_device[r.device] : -1 - r.node;
}

// Existence argument: every device is used, so a layout with every TP group
// in one island exists iff each island is a union of TP groups: tp | size.
bool tp_layout_exists(const Cluster& c, int tp) {
  for (int s : island_sizes_of(c))
    if (s % tp != 0) return false;
  return true;
}

// Structural invariants of any placement; "" when all hold.
std::string check_structure(const Cluster& c, const Mesh& m, const Placement& p) {
  std::ostringstream err;
  if (static_cast<int>(p.ranks.size()) != m.world()) return "wrong number of ranks";
  std::set<std::pair<int, int>> used;
  for (int r = 0; r < m.world(); ++r) {
    const RankPlacement& x = p.ranks[r];
    auto coord = dtrain::mesh::coord_of(m, r);
    if (x.rank != r) err << "rank " << r << " stored as " << x.rank << "; ";
    if (x.node < 0 || x.node >= static_cast<int>(c.nodes.size()) || x.device < 0 ||
        x.device >= c.nodes[x.node].devices)
      err << "rank " << r << " on bad slot " << x.node << "/" << x.device << "; ";
    if (!used.insert({x.node, x.device}).second) err << "slot reused by rank " << r << "; ";
    if (!(x.coord == coord)) err << "rank " << r << " coordinates differ from common/mesh.h; ";
  }
  using K = dtrain::mesh::GroupKind;
  std::vector<K> kinds = {K::tp, K::dp, K::pp};
  if (m.cp() > 1) kinds = {K::tp, K::cp, K::dp_cp, K::pp};
  if (m.ep > 1) kinds.push_back(K::ep);
  std::vector<std::string> axes;
  for (K kind : kinds) {
    const std::string axis = dtrain::mesh::group_name(kind);
    axes.push_back(axis);
    std::vector<int> seen(m.world(), 0);
    std::vector<std::vector<int>> groups;
    for (const auto& g : p.groups)
      if (g.axis == axis) {
        groups.push_back(g.ranks);
        for (int r : g.ranks) ++seen[r];
      }
    for (int r = 0; r < m.world(); ++r)
      if (seen[r] != 1) err << "rank " << r << " in " << seen[r] << " " << axis << " groups; ";
    if (groups != dtrain::mesh::groups(m, kind)) err << axis << " groups differ from mesh.h; ";
  }
  for (const auto& g : p.groups)
    if (std::find(axes.begin(), axes.end(), g.axis) == axes.end()) err << "stray axis " << g.axis << "; ";
  return err.str();
}

// Pipeline neighbours (the same coordinates but pp, stages s and s + 1) on one node.
int pp_pairs_on_one_node(const Mesh& m, const Placement& p) {
  int bad = 0;
  for (const auto& g : dtrain::mesh::groups(m, dtrain::mesh::GroupKind::pp))
    for (size_t i = 1; i < g.size(); ++i) bad += p.ranks[g[i - 1]].node == p.ranks[g[i]].node;
  return bad;
}

struct Tally {
  int cases = 0, refused = 0, slow = 0, pp_checked = 0;
};

void check_case(const Cluster& c, Mesh m, Tally& tally) {
  ++tally.cases;
  int nodes = static_cast<int>(c.nodes.size()), per_node = c.nodes[0].devices;
  CAPTURE(nodes);
  CAPTURE(per_node);
  CAPTURE(dtrain::mesh::format_mesh(m));
  CAPTURE(island_sizes_of(c).size());
  CAPTURE(island_sizes_of(c)[0]);
  TrafficModel t;
  bool exists = tp_layout_exists(c, m.tp());
  if (!exists) {
    ++tally.refused;
    CHECK_THROWS_AS(place_ranks(c, m, t), Error);
    Placement slow = place_ranks(c, m, t, /*allow_slow=*/true);
    CHECK(!slow.warnings.empty());
    CHECK_MESSAGE(check_structure(c, m, slow).empty(), check_structure(c, m, slow));
    ++tally.slow;
    return;
  }
  Placement p = place_ranks(c, m, t);
  std::string err = check_structure(c, m, p);
  CHECK_MESSAGE(err.empty(), err);
  for (const auto& g : p.groups) {
    if (g.axis != "tp") continue;
    for (int r : g.ranks)
      CHECK_MESSAGE(island_of(c, p.ranks[r]) == island_of(c, p.ranks[g.ranks[0]]),
                    "TP group crosses an island at rank " << r);
    CHECK(g.tier == (c.nodes[0].gpu ? LinkTier::nvlink : LinkTier::loopback));
  }
  // PP neighbours on other nodes: achievable whenever TP groups tile nodes
  // evenly (tp | devices per node, or whole nodes per TP group).
  bool tiles = per_node % m.tp() == 0 || m.tp() % per_node == 0;
  if (nodes > 1 && m.pp() > 1 && tiles) {
    ++tally.pp_checked;
    CHECK_MESSAGE(pp_pairs_on_one_node(m, p) == 0, "PP neighbours share a node");
    CHECK(p.warnings.empty());
  }
}

// nvlink_domain values to try for one node size: whole node, 2, 4, 8 (when
// they fit in a node), and islands spanning 2 nodes and the whole cluster.
std::vector<int> domains_for(int nodes, int per_node) {
  std::set<int> d = {0};
  for (int s : {2, 4, 8})
    if (s <= per_node) d.insert(s);
  if (nodes >= 2 && nodes % 2 == 0) d.insert(2 * per_node);
  if (nodes >= 2) d.insert(nodes * per_node);
  return {d.begin(), d.end()};
}

}  // namespace

TEST_CASE("placement: every factorisation over every cluster shape") {
  Tally tally;
  for (int world : {8, 12, 16, 64})
    for (int nodes : {1, 2, 3, 4, 8}) {
      if (world % nodes != 0) continue;
      int per_node = world / nodes;
      for (const Mesh& mesh : factorisations(world)) {
        check_case(make_cluster(nodes, per_node, 0, /*gpu=*/false), mesh, tally);
        for (int domain : domains_for(nodes, per_node)) {
          Cluster c = make_cluster(nodes, per_node, domain, /*gpu=*/true);
          check_case(c, mesh, tally);
          // EP: the smallest ep > 1 that divides dp*tp, groups formed in-stage.
          for (int ep = 2; mesh.cp() == 1 && ep <= mesh.dp() * mesh.tp(); ++ep)
            if ((mesh.dp() * mesh.tp()) % ep == 0) {
              Mesh with_ep = mesh;
              with_ep.ep = ep;
              check_case(c, with_ep, tally);
              break;
            }
        }
      }
    }
  MESSAGE("placement cases: " << tally.cases << ", refused (TP would cross islands): "
                              << tally.refused << ", PP-across-nodes checked: " << tally.pp_checked);
  CHECK(tally.cases > 1000);
  CHECK(tally.refused > 0);
  CHECK(tally.pp_checked > 100);
}

TEST_CASE("placement: gpt-3d on 2 nodes x 4 GPUs keeps TP in a node, PP across nodes") {
  Cluster c = make_cluster(2, 4, 0, true);
  Placement p = place_ranks(c, make_mesh(2, 2, 2, 1), TrafficModel{});
  for (const auto& g : p.groups) {
    if (g.axis == "tp") {
      CHECK(p.ranks[g.ranks[0]].node == p.ranks[g.ranks[1]].node);
      CHECK(g.tier == LinkTier::nvlink);
    }
    if (g.axis == "pp") {
      CHECK(p.ranks[g.ranks[0]].node != p.ranks[g.ranks[1]].node);
      CHECK(g.tier == LinkTier::ib);
    }
  }
}

TEST_CASE("placement: stages smaller than a node alternate nodes") {
  // 2 nodes x 8, dp=2 tp=2 pp=4: in rank order stages 0,1 would share node 0.
  Cluster c = make_cluster(2, 8, 0, true);
  Placement p = place_ranks(c, make_mesh(2, 2, 4, 1), TrafficModel{});
  for (const auto& r : p.ranks) CHECK(r.node == r.coord[dtrain::mesh::Axis::pp] % 2);
  for (const auto& g : p.groups)
    if (g.axis == "dp") CHECK(g.tier == LinkTier::nvlink);  // a stage stays on one node
}

TEST_CASE("placement: islands spanning nodes (NVL72-like) carry TP over nvlink") {
  Cluster c = make_cluster(4, 4, 8, true);  // islands {node0,node1}, {node2,node3}
  CHECK(c.nodes[1].island_of_device[0] == c.nodes[0].island_of_device[0]);
  CHECK(c.nodes[2].island_of_device[0] != c.nodes[0].island_of_device[0]);
  Placement p = place_ranks(c, make_mesh(1, 8, 2, 1), TrafficModel{});
  for (const auto& g : p.groups) {
    if (g.axis == "tp") CHECK(g.tier == LinkTier::nvlink);
    if (g.axis == "pp") CHECK(g.tier == LinkTier::ib);
  }
}

TEST_CASE("placement: tiers of CPU nodes and of GPU islands inside a node") {
  Placement cpu = place_ranks(make_cluster(1, 8, 0, false), make_mesh(2, 2, 2, 1), TrafficModel{});
  for (const auto& g : cpu.groups) CHECK(g.tier == LinkTier::loopback);
  Placement split = place_ranks(make_cluster(1, 8, 4, true), make_mesh(2, 4, 1, 1), TrafficModel{});
  for (const auto& g : split.groups)
    CHECK(g.tier == (g.axis == "dp" ? LinkTier::pcie : LinkTier::nvlink));  // pp: 1 rank
  CHECK(std::string(link_tier_name(LinkTier::pcie)) == "pcie");
  CHECK(tier_slowness(LinkTier::ib) > tier_slowness(LinkTier::pcie));
  CHECK(tier_slowness(LinkTier::nvlink) < tier_slowness(LinkTier::loopback));
}

TEST_CASE("placement: errors name every factor, the TP group and the island sizes") {
  Cluster c = make_cluster(2, 4, 0, true);
  try {
    place_ranks(c, make_mesh(2, 2, 4, 1), TrafficModel{});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    std::string msg = e.message();
    CHECK(msg.find("dp(2) * tp(2) * pp(4) = 16") != std::string::npos);
    CHECK(msg.find("2 nodes x 4 devices = 8") != std::string::npos);
  }
  try {
    place_ranks(make_cluster(2, 8, 2, true), make_mesh(2, 4, 2, 1), TrafficModel{});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    std::string msg = e.message();
    CAPTURE(msg);
    CHECK(msg.find("TP group 0 (ranks [0, 1, 2, 3], tp = 4)") != std::string::npos);
    CHECK(msg.find("island sizes are [2, 2, 2, 2, 2, 2, 2, 2]") != std::string::npos);
    CHECK(e.hint().find("{1, 2}") != std::string::npos);
    CHECK(e.hint().find("--allow-slow") != std::string::npos);
  }
  Placement slow = place_ranks(make_cluster(2, 8, 2, true), make_mesh(2, 4, 2, 1), TrafficModel{}, true);
  REQUIRE(slow.warnings.size() == 1);
  CHECK(slow.warnings[0].find("allow-slow") != std::string::npos);
  CHECK_THROWS_AS(place_ranks(c, make_mesh(3, 1, 1, 2), TrafficModel{}), Error);  // ep does not divide
  CHECK_THROWS_AS(place_ranks(c, make_mesh(0, 1, 1, 1), TrafficModel{}), Error);
  CHECK_THROWS_AS(make_cluster(2, 4, 6, true), Error);  // spans nodes, not a multiple
  CHECK_THROWS_AS(make_cluster(0, 4, 0, true), Error);
  Cluster bad = c;
  bad.nodes[1].island_of_device = {0, 1};
  CHECK_THROWS_AS(place_ranks(bad, make_mesh(2, 2, 2, 1), TrafficModel{}), Error);
}

TEST_CASE("placement: heterogeneous cluster from agents (rendezvous input)") {
  Cluster c;
  c.nodes.push_back({"a", 4, true, {7, 7, 9, 9}});
  c.nodes.push_back({"b", 2, true, {}});  // reported no islands: one per node
  c.nodes.push_back({"c", 2, false, {}});
  Placement p = place_ranks(c, make_mesh(4, 2, 1, 1), TrafficModel{});
  CHECK(check_structure(c, make_mesh(4, 2, 1, 1), p).empty());
  for (const auto& g : p.groups)
    if (g.axis == "tp") CHECK(p.ranks[g.ranks[0]].node == p.ranks[g.ranks[1]].node);
}

TEST_CASE("traffic: bytes per step on a hand-computed case") {
  // V=256, T=64, C=128, L=4: 2*256*128 + 64*128 + 4*(12*128^2 + 13*128) + 2*128 = 867072.
  dtrain::JobSpec spec;
  spec.model.vocab = 256;
  spec.model.seq_len = 64;
  spec.model.d_model = 128;
  spec.model.layers = 4;
  spec.train.micro_batch = 8;
  spec.train.grad_accum = 2;
  spec.parallel.dp = 2;
  spec.parallel.tp = 2;
  spec.parallel.pp = 2;
  TrafficModel t = traffic_model_from_spec(spec);
  CHECK(t.params == 867072);
  CHECK(t.bytes_per_elem == 4);
  Placement p = place_ranks(make_cluster(1, 8, 0, false), spec.mesh(), t);
  std::map<std::string, uint64_t> bytes;
  for (const auto& g : p.groups) bytes[g.axis] = g.bytes_per_step;
  uint64_t act = 8 * 64 * 128 * 4;  // micro_batch x seq_len x d_model x 4 bytes = 262144
  // dp: 2(n-1)/n = 1 x params/(tp*pp) x 4 bytes.
  CHECK(bytes["dp"] == 867072 / 4 * 4);
  // tp, per stage: grad_accum 2 x (4 layers / pp 2 x 4 all-reduces + the
  // embedding on stage 0, the head on stage 1) x 2(n-1)/n = 1 x act; stage 1
  // also the cross-entropy's 3 all-reduces of 8 x 64 fp32; both the 8-byte norm.
  int tp_groups = 0;
  for (const auto& g : p.groups)
    if (g.axis == "tp") {
      ++tp_groups;
      if (p.ranks[g.ranks[0]].coord[dtrain::mesh::Axis::pp] == 0) CHECK(g.bytes_per_step == 2 * (2 * 4 + 1) * act + 8);
      else CHECK(g.bytes_per_step == 2 * ((2 * 4 + 1) * act + 3 * 8 * 64 * 4) + 8);
    }
  CHECK(tp_groups == 4);
  // pp: grad_accum 2 x 2 directions x 1 boundary x act.
  CHECK(bytes["pp"] == 2 * 2 * 1 * act);
  // Uneven stages (parallel.pipeline.layers_per_stage [1, 3]): each stage's
  // tp group counts its own blocks.
  spec.parallel.pipeline_layers_per_stage = {1, 3};
  Placement uneven = place_ranks(make_cluster(1, 8, 0, false), spec.mesh(), traffic_model_from_spec(spec));
  for (const auto& g : uneven.groups)
    if (g.axis == "tp") {
      if (uneven.ranks[g.ranks[0]].coord[dtrain::mesh::Axis::pp] == 0) CHECK(g.bytes_per_step == 2 * (1 * 4 + 1) * act + 8);
      else CHECK(g.bytes_per_step == 2 * ((3 * 4 + 1) * act + 3 * 8 * 64 * 4) + 8);
    }
  spec.parallel.pipeline_layers_per_stage.clear();
  t.zero = 3;
  Placement z3 = place_ranks(make_cluster(1, 8, 0, false), spec.mesh(), t);
  for (const auto& g : z3.groups)
    if (g.axis == "dp") CHECK(g.bytes_per_step == 867072 * 3 / 2);
  // dp = 4 ring: 2 * 3/4 of the gradient bytes (1000 params x 4 bytes).
  TrafficModel small;
  small.params = 1000;
  Placement dp4 = place_ranks(make_cluster(1, 4, 0, false), make_mesh(4, 1, 1, 1), small);
  int dp_groups = 0;
  for (const auto& g : dp4.groups)
    if (g.axis == "dp") {
      ++dp_groups;
      CHECK(g.bytes_per_step == 6000);
    }
  CHECK(dp_groups == 1);
}

TEST_CASE("traffic: tp bytes per step equal the engine's tp_bytes_sent (pp = 1)") {
  // The engine's metrics.jsonl said 330760 for this spec: per micro-batch
  // (2 layers x 4 + embedding + head) all-reduces of 8 x 32 x 32 x 4 bytes,
  // 3 cross-entropy all-reduces of 8 x 32 x 4 bytes, one 8-byte grad norm.
  dtrain::JobSpec spec;
  spec.model.vocab = 256;
  spec.model.seq_len = 32;
  spec.model.d_model = 32;
  spec.model.layers = 2;
  spec.model.heads = 4;
  spec.train.micro_batch = 8;
  spec.parallel.tp = 2;
  auto tp_bytes = [&](int procs) {
    Placement p = place_ranks(make_cluster(1, procs, 0, false), spec.mesh(),
                              traffic_model_from_spec(spec));
    for (const auto& g : p.groups)
      if (g.axis == "tp") return g.bytes_per_step;
    return uint64_t{0};
  };
  CHECK(tp_bytes(2) == 330760);
  CHECK(tp_bytes(2) == 10 * 32768 + 3 * 1024 + 8);
  spec.parallel.tp = 4;  // 2(n-1)/n = 3/2
  CHECK(tp_bytes(4) == 10 * 32768 * 3 / 2 + 3 * 1024 * 3 / 2 + 12);
  spec.train.grad_accum = 3;  // the norm once a step, the rest per micro-batch
  CHECK(tp_bytes(4) == 3 * (10 * 32768 * 3 / 2 + 3 * 1024 * 3 / 2) + 12);
}

TEST_CASE("traffic: MoE blocks under tp all-gather the token shares; ep sends the rank's share") {
  // Per micro-batch: 2 attention all-reduces per block, 2 MLP ones per dense
  // block, embedding and head; per MoE block, all-gathers of this rank's
  // [top_k, tokens / tp, C] expert outputs and [tokens / tp, C] input grads.
  dtrain::JobSpec spec;
  spec.model.vocab = 256;
  spec.model.seq_len = 32;
  spec.model.d_model = 32;
  spec.model.layers = 2;
  spec.model.heads = 4;
  spec.model.moe.experts = 4;
  spec.model.moe.top_k = 2;
  spec.model.moe.every = 2;  // block 0 MoE, block 1 dense
  spec.train.micro_batch = 8;
  spec.parallel.dp = 2;
  spec.parallel.tp = 2;
  spec.parallel.ep = 2;
  Placement p = place_ranks(make_cluster(1, 4, 0, false), spec.mesh(), traffic_model_from_spec(spec));
  uint64_t tp = 0, ep = 0, dp = 0, edp = 0;
  int edp_groups = 0;
  for (const auto& g : p.groups) {
    if (g.axis == "tp") tp = g.bytes_per_step;
    if (g.axis == "ep") ep = g.bytes_per_step;
    if (g.axis == "dp") dp = g.bytes_per_step;
    if (g.axis == "edp") edp = g.bytes_per_step, ++edp_groups;
  }
  // dp: the dense gradients only, a MoE block's router in place of its MLP
  // (C = 32): wte 256C + wpe 32C + ln_f 2C + head 256C = 17472; the dense
  // block 12C^2 + 13C = 12704; the MoE block's attention and norms 4C^2 +
  // 8C = 4352 and router 4C = 128: 34656, over tp 2, 4 bytes, AR over 2 = x1.
  CHECK(dp == 34656 / 2 * 4);
  // edp: the ranks holding the same 2 experts ({0, 2} and {1, 3}: dp x tp /
  // ep = 2 of them) all-reduce their fp32 gradients once a step: 1 MoE block
  // x 2 experts x (fc 4C*C + 4C, proj C*4C + C = 8352) x 4 bytes, AR x1.
  CHECK(edp_groups == 2);
  CHECK(edp == 1 * 2 * 8352 * 4);
  const uint64_t act = 8 * 32 * 32 * 4, share = act / 2;
  CHECK(tp == (2 * 2 + 2 + 2) * act + (2 * share + share) + 3 * 1024 + 8);
  // ep: 4 all-to-alls of the share's top_k rows, half of them to the other
  // rank, the counts, and the experts' norm all-reduce for clipping.
  CHECK(ep == 4 * share * 2 / 2 + (4 - 2) * 8 + 8);
}

TEST_CASE("renderings: JSON schema, text table, SVG") {
  Cluster c = make_cluster(2, 4, 0, true);
  Placement p = place_ranks(c, make_mesh(2, 2, 2, 1), TrafficModel{});
  auto j = nlohmann::json::parse(placement_to_json(p));
  CHECK(j["world"] == 8);
  CHECK(j["mesh"] == nlohmann::json({{"dp", 2}, {"tp", 2}, {"pp", 2}, {"ep", 1}}));
  REQUIRE(j["ranks"].size() == 8);
  CHECK(j["ranks"][5] == nlohmann::json({{"rank", 5}, {"node", 1}, {"device", 1}, {"dp", 0},
                                         {"tp", 1}, {"pp", 1}, {"ep", 0}}));
  CHECK(j["groups"].size() == 12);
  CHECK(j["groups"][0]["axis"] == "tp");
  CHECK(j["groups"][0]["tier"] == "nvlink");
  CHECK(j["warnings"].is_array());
  std::string text = placement_to_text(p, c);
  CHECK(text.find("node1") != std::string::npos);
  CHECK(text.find("bytes/step") != std::string::npos);
  std::string svg = placement_to_svg(p, c);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("stage 1") != std::string::npos);
  CHECK(svg.find(" ib<") != std::string::npos);  // a link label: "pp ib" or "dp ib"
}

// ---- the real binary -------------------------------------------------------

namespace {

std::vector<std::string> config_files() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dtrain::testing::source_dir() + "/configs"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::pair<int, std::string> dtrain_run(const std::vector<std::string>& args) {
  dtrain::testing::TempDir tmp;
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return dtrain::testing::run_command(argv, tmp / "out.txt", 60);
}

// stdout of `dtrain topo --format json` with any log lines before the JSON.
nlohmann::json parse_json_output(const std::string& out) {
  return nlohmann::json::parse(out.substr(std::min(out.find('{'), out.size())));
}

}  // namespace

TEST_CASE("dtrain topo and validate on every file in configs/") {
  REQUIRE_MESSAGE(std::filesystem::exists(dtrain::testing::dtrain_bin()),
                  "build the dtrain target first: " << dtrain::testing::dtrain_bin());
  auto files = config_files();
  CHECK(files.size() >= 2);  // quickstart.yaml and gpt-3d.yaml at least
  for (const auto& file : files) {
    CAPTURE(file);
    auto [vrc, vout] = dtrain_run({"validate", file});
    CHECK_MESSAGE(vrc == 0, vout);
    auto [rc, out] = dtrain_run({"topo", file, "--format", "json"});
    REQUIRE_MESSAGE(rc == 0, out);
    std::vector<std::string> warnings;
    dtrain::JobSpec spec = dtrain::load_job_spec(file, {}, &warnings);
    auto expected = nlohmann::json::parse(placement_to_json(place_job(spec, false, warnings)));
    CHECK(parse_json_output(out) == expected);
    auto [trc, tout] = dtrain_run({"topo", file});
    CHECK_MESSAGE(trc == 0, tout);
    CHECK(tout.find("bytes/step") != std::string::npos);
  }
}

TEST_CASE("dtrain topo: gpt-3d groups on 2 nodes, a bad tp, split islands, --allow-slow, --svg") {
  std::string gpt = dtrain::testing::source_dir() + "/configs/gpt-3d.yaml";
  auto [rc, out] = dtrain_run({"topo", gpt, "--nodes", "2", "--gpus-per-node", "4", "--format", "json"});
  REQUIRE_MESSAGE(rc == 0, out);
  auto j = parse_json_output(out);
  int tp_groups = 0, pp_groups = 0;
  for (const auto& g : j["groups"]) {
    std::set<int> nodes;
    for (int r : g["ranks"]) nodes.insert(j["ranks"][r]["node"].get<int>());
    if (g["axis"] == "tp") tp_groups += nodes.size() == 1;
    if (g["axis"] == "pp") pp_groups += nodes.size() == g["ranks"].size();
  }
  CHECK(tp_groups == 4);
  CHECK(pp_groups == 4);
  auto [bad_rc, bad_out] = dtrain_run({"topo", gpt, "--set", "parallel.tp=3"});
  CHECK(bad_rc == 2);
  CHECK(bad_out.find("parallel.tp") != std::string::npos);
  CHECK(bad_out.find("model.heads") != std::string::npos);
  // 4 GPUs per node in islands of 3 and 1: tp = 2 cannot stay inside one.
  auto [split_rc, split_out] = dtrain_run({"topo", gpt, "--nodes", "2", "--gpus-per-node", "4",
                                           "--nvlink-domain", "3"});
  CHECK(split_rc == 2);
  CHECK(split_out.find("island sizes are [3, 1, 3, 1]") != std::string::npos);
  auto [slow_rc, slow_out] = dtrain_run({"topo", gpt, "--nodes", "2", "--gpus-per-node", "4",
                                         "--nvlink-domain", "3", "--allow-slow", "--format", "json"});
  REQUIRE_MESSAGE(slow_rc == 0, slow_out);
  CHECK(!parse_json_output(slow_out)["warnings"].empty());
  dtrain::testing::TempDir tmp;
  auto [svg_rc, svg_out] = dtrain_run({"topo", gpt, "--svg", tmp / "mesh.svg"});
  CHECK_MESSAGE(svg_rc == 0, svg_out);
  CHECK(dtrain::testing::read_file(tmp / "mesh.svg").find("<svg") == 0);
}
