// common/mesh.h: the general mesh gives every layout the tests use the same
// rank order and groups as the four-axis mesh it replaced (kept below as the
// reference, verbatim in what it computes), the new cp and derived groups are
// disjoint and cover the world, and the texts (order, DTRAIN_MESH,
// DTRAIN_COORD) parse back and name what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/mesh.h"

using namespace dtrain::mesh;

namespace {

// The four-axis mesh as it was: rank = (pp * dp + d) * tp + t, ep groups
// consecutive runs of ep ranks among the dp * tp ranks of a stage.
struct OldShape {
  int dp = 1, tp = 1, pp = 1, ep = 1;
  int world() const { return dp * tp * pp; }
};
int old_rank_of(const OldShape& s, int dp, int tp, int pp) { return (pp * s.dp + dp) * s.tp + tp; }
std::vector<std::vector<int>> old_axis_groups(const OldShape& s, const std::string& axis) {
  std::vector<std::vector<int>> groups;
  if (axis == "tp") {
    for (int pp = 0; pp < s.pp; ++pp)
      for (int dp = 0; dp < s.dp; ++dp) {
        std::vector<int> g;
        for (int tp = 0; tp < s.tp; ++tp) g.push_back(old_rank_of(s, dp, tp, pp));
        groups.push_back(g);
      }
  } else if (axis == "dp") {
    for (int pp = 0; pp < s.pp; ++pp)
      for (int tp = 0; tp < s.tp; ++tp) {
        std::vector<int> g;
        for (int dp = 0; dp < s.dp; ++dp) g.push_back(old_rank_of(s, dp, tp, pp));
        groups.push_back(g);
      }
  } else if (axis == "pp") {
    for (int dp = 0; dp < s.dp; ++dp)
      for (int tp = 0; tp < s.tp; ++tp) {
        std::vector<int> g;
        for (int pp = 0; pp < s.pp; ++pp) g.push_back(old_rank_of(s, dp, tp, pp));
        groups.push_back(g);
      }
  } else if (axis == "ep" || axis == "edp") {
    int stage = s.dp * s.tp;
    for (int pp = 0; pp < s.pp; ++pp) {
      if (axis == "ep") {
        for (int start = 0; start < stage; start += s.ep) {
          std::vector<int> g;
          for (int i = start; i < start + s.ep && i < stage; ++i) g.push_back(pp * stage + i);
          groups.push_back(g);
        }
      } else {
        for (int e = 0; e < s.ep; ++e) {
          std::vector<int> g;
          for (int i = e; i < stage; i += s.ep) g.push_back(pp * stage + i);
          groups.push_back(g);
        }
      }
    }
  }
  return groups;
}

// Disjoint, covering, every group the same size.
std::string partition_problem(const Mesh& m, GroupKind kind) {
  std::vector<int> seen(size_t(m.world()), 0);
  auto gs = groups(m, kind);
  for (auto& g : gs) {
    if (g.size() != gs[0].size()) return "groups of unequal size";
    for (int r : g) ++seen[size_t(r)];
  }
  for (int r = 0; r < m.world(); ++r)
    if (seen[size_t(r)] != 1) return "rank " + std::to_string(r) + " in " + std::to_string(seen[size_t(r)]) + " groups";
  return "";
}

}  // namespace

TEST_CASE("mesh: every layout of the tests keeps today's ranks and groups") {
  // (dp, tp, pp, ep): the layouts the parity, resume, MoE and placement tests run.
  const std::vector<OldShape> layouts = {
      {1, 1, 1, 1}, {2, 1, 1, 1}, {4, 1, 1, 1}, {8, 1, 1, 1}, {1, 2, 1, 1}, {2, 2, 1, 1}, {1, 4, 1, 1},
      {1, 1, 2, 1}, {2, 1, 2, 1}, {1, 1, 4, 1}, {2, 2, 2, 1}, {1, 2, 2, 1}, {2, 4, 1, 1}, {4, 2, 1, 1},
      {4, 1, 1, 2}, {4, 1, 1, 4}, {2, 2, 1, 2}, {2, 2, 1, 4}, {1, 2, 1, 2}, {2, 1, 2, 2}, {3, 1, 1, 3},
      {3, 2, 2, 1}, {6, 1, 2, 3}, {2, 4, 2, 8}};
  int compared = 0;
  for (const OldShape& s : layouts) {
    CAPTURE(s.dp);
    CAPTURE(s.tp);
    CAPTURE(s.pp);
    CAPTURE(s.ep);
    const Mesh m = make_mesh(s.dp, s.tp, s.pp, s.ep);
    REQUIRE(m.world() == s.world());
    for (int d = 0; d < s.dp; ++d)
      for (int t = 0; t < s.tp; ++t)
        for (int p = 0; p < s.pp; ++p) {
          Coord c;
          c[Axis::dp] = d, c[Axis::tp] = t, c[Axis::pp] = p;
          CHECK(rank_of(m, c) == old_rank_of(s, d, t, p));
          Coord back = coord_of(m, old_rank_of(s, d, t, p));
          CHECK(back[Axis::dp] == d);
          CHECK(back[Axis::tp] == t);
          CHECK(back[Axis::pp] == p);
          CHECK(back.ep == (d * s.tp + t) % s.ep);
        }
    for (auto [kind, name] : {std::pair{GroupKind::tp, "tp"}, {GroupKind::dp, "dp"}, {GroupKind::pp, "pp"},
                              {GroupKind::ep, "ep"}, {GroupKind::edp, "edp"}}) {
      CHECK_MESSAGE(groups(m, kind) == old_axis_groups(s, name), name);
      ++compared;
    }
    // cp = 1: the derived group is dp's, the cp groups are single ranks.
    CHECK(groups(m, GroupKind::dp_cp) == groups(m, GroupKind::dp));
    CHECK(groups(m, GroupKind::cp).size() == size_t(m.world()));
  }
  MESSAGE(layouts.size() << " layouts, " << compared << " group tables identical to the four-axis mesh");
}

TEST_CASE("mesh: cp and derived groups are disjoint and cover the world, in any order") {
  std::vector<Order> orders = {kDefaultOrder};
  Order o = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};
  std::sort(o.begin(), o.end());
  do orders.push_back(o);
  while (std::next_permutation(o.begin(), o.end()));
  int checked = 0;
  for (const Order& order : orders)
    for (int cp : {1, 2, 4})
      for (int tp : {1, 2})
        for (int pp : {1, 2})
          for (int dp : {1, 2, 3}) {
            const Mesh m = make_mesh(dp, tp, pp, 1, cp, order);
            CAPTURE(format_mesh(m));
            for (const GroupDef& def : group_defs()) {
              CHECK_MESSAGE(partition_problem(m, def.kind).empty(), def.name << ": " << partition_problem(m, def.kind));
              ++checked;
            }
            CHECK(groups(m, GroupKind::cp)[0].size() == size_t(cp));
            CHECK(groups(m, GroupKind::dp_cp)[0].size() == size_t(dp * cp));
            // A dp_cp group is the union of the cp groups of its dp members.
            for (int r = 0; r < m.world(); ++r) {
              std::set<int> want;
              for (int d : group_of(m, GroupKind::dp, r))
                for (int c : group_of(m, GroupKind::cp, d)) want.insert(c);
              auto got = group_of(m, GroupKind::dp_cp, r);
              CHECK(std::set<int>(got.begin(), got.end()) == want);
              CHECK(rank_of(m, coord_of(m, r)) == r);
              for (GroupKind k : {GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::pp, GroupKind::dp_cp}) {
                const auto g = group_of(m, k, r);
                CHECK(g[size_t(index_in_group(m, k, coord_of(m, r)))] == r);
              }
            }
          }
  // The order is the rank order: the innermost axis moves fastest.
  const Mesh inner_cp = make_mesh(2, 1, 1, 1, 2, {Axis::cp, Axis::tp, Axis::dp, Axis::pp});
  CHECK(groups(inner_cp, GroupKind::cp)[0] == std::vector<int>{0, 1});
  const Mesh outer_cp = make_mesh(2, 1, 1, 1, 2, {Axis::tp, Axis::dp, Axis::pp, Axis::cp});
  CHECK(groups(outer_cp, GroupKind::cp)[0] == std::vector<int>{0, 2});
  MESSAGE(checked << " (mesh, group) partitions checked over " << orders.size() << " orders");
}

TEST_CASE("mesh: order, DTRAIN_MESH and DTRAIN_COORD texts") {
  Order o{};
  std::string why;
  CHECK(parse_order("tp-cp-dp-pp", &o, &why));
  CHECK(o == kDefaultOrder);
  CHECK(format_order(o) == "tp-cp-dp-pp");
  CHECK(parse_order("pp-dp-cp-tp", &o, &why));
  CHECK(o[0] == Axis::pp);
  CHECK_FALSE(parse_order("tp-cp-dp", &o, &why));
  CHECK(why.find("axis pp is missing") != std::string::npos);
  CHECK_FALSE(parse_order("tp-cp-dp-xp", &o, &why));
  CHECK(why.find("'xp' is not an axis") != std::string::npos);
  CHECK_FALSE(parse_order("tp-tp-dp-pp", &o, &why));
  CHECK(why.find("tp appears twice") != std::string::npos);

  const Mesh m = make_mesh(2, 2, 2, 2, 2, {Axis::tp, Axis::dp, Axis::cp, Axis::pp});
  CHECK(format_mesh(m) == "tp=2,dp=2,cp=2,pp=2,ep=2");
  Mesh back;
  REQUIRE(parse_mesh(format_mesh(m), &back, &why));
  CHECK(back == m);
  CHECK(format_coord(m, coord_of(m, 13)) == "tp=1,dp=0,cp=1,pp=1,ep=1");
  // Axes not named have size 1; where they sit does not change a rank.
  REQUIRE(parse_mesh("dp=4", &back, &why));
  CHECK(back.dp() == 4);
  CHECK(back.world() == 4);
  CHECK_FALSE(parse_mesh("tp=2,zz=2", &back, &why));
  CHECK(why.find("unknown axis 'zz'") != std::string::npos);
  CHECK_FALSE(parse_mesh("tp=0", &back, &why));
  CHECK_FALSE(parse_mesh("tp=2,tp=2", &back, &why));
  CHECK_FALSE(parse_mesh("dp=3,ep=2", &back, &why));
  CHECK(why.find("ep(2) does not divide") != std::string::npos);
  CHECK(describe(make_mesh(2, 2, 2)) == "dp=2,tp=2,pp=2,ep=1");
  CHECK(describe(make_mesh(2, 1, 1, 1, 2)) == "dp=2,tp=1,pp=1,cp=2,ep=1");
}
