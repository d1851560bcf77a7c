// The mesh's rank order, groups and texts (mesh.h). Ranks are mixed-radix
// numbers over the axes of `order`, innermost first; ep and edp groups fold
// into the ranks of a stage taken in rank order.
#include "common/mesh.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

namespace dtrain::mesh {

namespace {
constexpr const char* kAxisNames[kAxes] = {"tp", "cp", "dp", "pp"};
}  // namespace

const char* axis_name(Axis axis) { return kAxisNames[static_cast<int>(axis)]; }

bool parse_axis(std::string_view name, Axis* out) {
  for (Axis a : kAllAxes)
    if (name == axis_name(a)) {
      *out = a;
      return true;
    }
  return false;
}

std::string format_order(const Order& order) {
  std::string s;
  for (Axis a : order) s += (s.empty() ? "" : "-") + std::string(axis_name(a));
  return s;
}

bool parse_order(std::string_view text, Order* out, std::string* problem) {
  std::vector<Axis> seen;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('-', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view name = text.substr(start, end - start);
    Axis a{};
    if (!parse_axis(name, &a)) {
      *problem = "'" + std::string(name) + "' is not an axis (axes: tp, cp, dp, pp)";
      return false;
    }
    if (std::find(seen.begin(), seen.end(), a) != seen.end()) {
      *problem = "axis " + std::string(name) + " appears twice";
      return false;
    }
    seen.push_back(a);
    start = end + 1;
  }
  for (Axis a : kAllAxes)
    if (std::find(seen.begin(), seen.end(), a) == seen.end()) {
      *problem = "axis " + std::string(axis_name(a)) + " is missing (name each of tp, cp, dp, pp once)";
      return false;
    }
  std::copy(seen.begin(), seen.end(), out->begin());
  return true;
}

const std::vector<GroupDef>& group_defs() {
  static const std::vector<GroupDef> defs = {
      {GroupKind::tp, "tp", {Axis::tp}, "tensor parallelism: split layers, activation all-reduces"},
      {GroupKind::cp, "cp", {Axis::cp}, "context parallelism: the sequence split, K/V passed in a ring"},
      {GroupKind::dp, "dp", {Axis::dp}, "data parallelism: replicas of one shard"},
      {GroupKind::pp, "pp", {Axis::pp}, "pipeline parallelism: stages, activations sent point to point"},
      {GroupKind::dp_cp, "dp_cp", {Axis::dp, Axis::cp}, "gradient reduction: every replica of a shard"},
      {GroupKind::ep, "ep", {}, "expert parallelism: tokens exchanged by all-to-all"},
      {GroupKind::edp, "edp", {}, "ranks holding the same experts: their gradient reduction"},
  };
  return defs;
}

const char* group_name(GroupKind kind) { return group_defs()[static_cast<size_t>(kind)].name; }

bool parse_group(std::string_view name, GroupKind* out) {
  for (const GroupDef& d : group_defs())
    if (name == d.name) {
      *out = d.kind;
      return true;
    }
  return false;
}

Mesh make_mesh(int dp, int tp, int pp, int ep, int cp, const Order& order) {
  Mesh m;
  m.order = order;
  m.size(Axis::dp) = dp;
  m.size(Axis::tp) = tp;
  m.size(Axis::pp) = pp;
  m.size(Axis::cp) = cp;
  m.ep = ep;
  return m;
}

int rank_of(const Mesh& m, const Coord& c) {
  int rank = 0;
  for (int i = kAxes - 1; i >= 0; --i) rank = rank * m.size(m.order[size_t(i)]) + c[m.order[size_t(i)]];
  return rank;
}

namespace {

// The rank's index among the ranks of its stage, in rank order: the mixed
// radix number of its coordinates on every axis but pp.
int index_in_stage(const Mesh& m, const Coord& c) {
  int index = 0;
  for (int i = kAxes - 1; i >= 0; --i) {
    Axis a = m.order[size_t(i)];
    if (a != Axis::pp) index = index * m.size(a) + c[a];
  }
  return index;
}

}  // namespace

Coord coord_of(const Mesh& m, int rank) {
  Coord c;
  for (Axis a : m.order) {
    c[a] = rank % m.size(a);
    rank /= m.size(a);
  }
  c.ep = m.ep > 0 ? index_in_stage(m, c) % m.ep : 0;
  return c;
}

std::vector<std::vector<int>> groups(const Mesh& m, GroupKind kind) {
  const GroupDef& def = group_defs()[static_cast<size_t>(kind)];
  // Ranks with the same key are one group; groups come out in order of
  // their smallest rank, members ascending.
  std::map<int, std::vector<int>> by_first;
  std::map<std::vector<int>, int> first_of_key;
  for (int r = 0; r < m.world(); ++r) {
    Coord c = coord_of(m, r);
    std::vector<int> key;
    if (kind == GroupKind::ep || kind == GroupKind::edp) {
      int in_stage = index_in_stage(m, c);
      key = {c[Axis::pp], kind == GroupKind::ep ? in_stage / m.ep : in_stage % m.ep};
    } else {
      for (Axis a : kAllAxes)
        if (std::find(def.varying.begin(), def.varying.end(), a) == def.varying.end()) key.push_back(c[a]);
    }
    auto [it, fresh] = first_of_key.emplace(key, r);
    by_first[it->second].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [first, ranks] : by_first) out.push_back(std::move(ranks));
  return out;
}

std::vector<int> group_of(const Mesh& m, GroupKind kind, int rank) {
  for (auto& g : groups(m, kind))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  return {};
}

int index_in_group(const Mesh& m, GroupKind kind, const Coord& c) {
  const std::vector<Axis>& varying = group_defs()[static_cast<size_t>(kind)].varying;
  int index = 0;  // mixed radix over the varying axes, outermost first (members are in rank order)
  for (int i = kAxes - 1; i >= 0; --i) {
    const Axis a = m.order[size_t(i)];
    if (std::find(varying.begin(), varying.end(), a) != varying.end()) index = index * m.size(a) + c[a];
  }
  return index;
}

std::string format_mesh(const Mesh& m) {
  std::string s;
  for (Axis a : m.order) s += std::string(axis_name(a)) + "=" + std::to_string(m.size(a)) + ",";
  return s + "ep=" + std::to_string(m.ep);
}

std::string format_coord(const Mesh& m, const Coord& c) {
  std::string s;
  for (Axis a : m.order) s += std::string(axis_name(a)) + "=" + std::to_string(c[a]) + ",";
  return s + "ep=" + std::to_string(c.ep);
}

bool parse_mesh(std::string_view text, Mesh* out, std::string* problem) {
  Mesh m;
  std::vector<Axis> named;
  bool ep_named = false;
  std::stringstream ss{std::string(text)};
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    char* end = nullptr;
    long v = eq == std::string::npos ? 0 : std::strtol(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq + 1 == item.size() || !end || *end != '\0') {
      *problem = "'" + item + "' is not AXIS=INTEGER";
      return false;
    }
    std::string key = item.substr(0, eq);
    if (v < 1 || v > (1 << 20)) {
      *problem = key + " = " + std::to_string(v) + " must be >= 1";
      return false;
    }
    Axis a{};
    if (key == "ep") {
      if (ep_named) {
        *problem = "axis ep appears twice";
        return false;
      }
      ep_named = true;
      m.ep = int(v);
    } else if (parse_axis(key, &a)) {
      if (std::find(named.begin(), named.end(), a) != named.end()) {
        *problem = "axis " + key + " appears twice";
        return false;
      }
      named.push_back(a);
      m.size(a) = int(v);
    } else {
      *problem = "unknown axis '" + key + "'";
      return false;
    }
  }
  // Named axes first, in their order; the rest (size 1) after them.
  for (Axis a : kDefaultOrder)
    if (std::find(named.begin(), named.end(), a) == named.end()) named.push_back(a);
  std::copy(named.begin(), named.end(), m.order.begin());
  if (m.stage_ranks() % m.ep != 0) {
    *problem = "ep(" + std::to_string(m.ep) + ") does not divide the " + std::to_string(m.stage_ranks()) +
               " ranks of a stage (tp x cp x dp)";
    return false;
  }
  *out = m;
  return true;
}

std::string describe(const Mesh& m) {
  std::string s = "dp=" + std::to_string(m.dp()) + ",tp=" + std::to_string(m.tp()) + ",pp=" + std::to_string(m.pp());
  if (m.cp() > 1) s += ",cp=" + std::to_string(m.cp());
  return s + ",ep=" + std::to_string(m.ep);
}

std::string describe(const Mesh& m, const Coord& c) {
  std::string s = "dp=" + std::to_string(c[Axis::dp]) + ",tp=" + std::to_string(c[Axis::tp]) + ",pp=" +
                  std::to_string(c[Axis::pp]);
  if (m.cp() > 1) s += ",cp=" + std::to_string(c[Axis::cp]);
  return s + ",ep=" + std::to_string(c.ep);
}

}  // namespace dtrain::mesh
