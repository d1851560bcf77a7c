// The rank order of the DP x TP x PP (x EP) mesh, as pure inline functions.
// The one definition shared by placement (rendezvous/), which maps ranks to
// devices, and the engine, which builds one process group per axis from it.
// Order, innermost first: TP, then DP, then PP (Megatron's order). EP groups
// are consecutive runs of `ep` ranks among the dp*tp ranks of one stage
// (Megatron-Core's expert layout with expert TP 1): with tp > 1 a group holds
// TP ranks, which hold the same tokens and each dispatch their share of them
// (engine/model/moe.h), so every group's ranks send different tokens.
#pragma once

#include <string>
#include <vector>

namespace dtrain::mesh {

struct Shape {
  int dp = 1, tp = 1, pp = 1, ep = 1;
  int world() const { return dp * tp * pp; }
};

struct Coord {
  int dp = 0, tp = 0, pp = 0, ep = 0;
};

inline int rank_of(const Shape& s, int dp, int tp, int pp) {
  return (pp * s.dp + dp) * s.tp + tp;
}

inline Coord coord_of(const Shape& s, int rank) {
  Coord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  int in_stage = c.dp * s.tp + c.tp;  // index among the dp*tp ranks of the stage
  c.ep = in_stage % s.ep;
  return c;
}

// Every group of one axis ("dp", "tp", "pp", "ep"), each as sorted global
// ranks; the groups of one axis are disjoint and cover all ranks.
// ep groups: the ranks that exchange tokens in all-to-all (same stage,
// consecutive block of `ep` ranks); "edp": ranks holding the same experts.
inline std::vector<std::vector<int>> axis_groups(const Shape& s, const std::string& axis) {
  std::vector<std::vector<int>> groups;
  if (axis == "tp") {
    for (int pp = 0; pp < s.pp; ++pp)
      for (int dp = 0; dp < s.dp; ++dp) {
        std::vector<int> g;
        for (int tp = 0; tp < s.tp; ++tp) g.push_back(rank_of(s, dp, tp, pp));
        groups.push_back(g);
      }
  } else if (axis == "dp") {
    for (int pp = 0; pp < s.pp; ++pp)
      for (int tp = 0; tp < s.tp; ++tp) {
        std::vector<int> g;
        for (int dp = 0; dp < s.dp; ++dp) g.push_back(rank_of(s, dp, tp, pp));
        groups.push_back(g);
      }
  } else if (axis == "pp") {
    for (int dp = 0; dp < s.dp; ++dp)
      for (int tp = 0; tp < s.tp; ++tp) {
        std::vector<int> g;
        for (int pp = 0; pp < s.pp; ++pp) g.push_back(rank_of(s, dp, tp, pp));
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

// The group of `axis` that holds `rank`.
inline std::vector<int> group_of(const Shape& s, const std::string& axis, int rank) {
  for (auto& g : axis_groups(s, axis))
    for (int r : g)
      if (r == rank) return g;
  return {};
}

// "dp=2,tp=2,pp=2,ep=1" (DTRAIN_MESH) and "dp=1,tp=0,pp=1,ep=0" (DTRAIN_COORD).
inline std::string format_shape(const Shape& s) {
  return "dp=" + std::to_string(s.dp) + ",tp=" + std::to_string(s.tp) +
         ",pp=" + std::to_string(s.pp) + ",ep=" + std::to_string(s.ep);
}
inline std::string format_coord(const Coord& c) {
  return "dp=" + std::to_string(c.dp) + ",tp=" + std::to_string(c.tp) +
         ",pp=" + std::to_string(c.pp) + ",ep=" + std::to_string(c.ep);
}

}  // namespace dtrain::mesh
