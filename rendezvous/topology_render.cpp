// Renderings of a Placement for `dtrain topo`: a text table, the stable JSON
// schema (docs/ARCHITECTURE.md, 'Placement'), and an SVG drawing (nodes as boxes, devices
// coloured by TP group, PP stages left to right, edges labelled with their link tier).
// Formatting only: the placement math is in topology.cpp. The text stays
// readable at any size: past kTextRanksMax ranks the rank table and the group
// list are summarised (JSON keeps everything); every rendering is linear.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "rendezvous/topology.h"
#include "rendezvous/topology_detail.h"

namespace dtrain::rendezvous {
namespace {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string rpad(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

std::string mesh_line(const Placement& p) {
  const mesh::Mesh& m = p.mesh;
  return "mesh dp=" + std::to_string(m.dp()) + " tp=" + std::to_string(m.tp()) + " pp=" +
         std::to_string(m.pp()) + (m.cp() > 1 ? " cp=" + std::to_string(m.cp()) : std::string()) +
         " ep=" + std::to_string(m.ep) + ", world " +
         std::to_string(m.world());
}

constexpr size_t kTextRanksMax = 256;      // larger jobs: summarised text
constexpr size_t kRanksHead = 64, kRanksTail = 8;
constexpr size_t kGroupRanksShown = 16;    // a longer group shows its ends
constexpr size_t kGroupsPerAxisShown = 8;  // in a summarised job

using mesh::Axis;

void text_rank_row(std::ostringstream& out, const RankPlacement& r, const Cluster& cluster,
                   size_t host_w, bool cp) {
  std::string host = r.node < static_cast<int>(cluster.nodes.size()) ? cluster.nodes[r.node].host : "?";
  out << rpad(std::to_string(r.rank), 5) << rpad(std::to_string(r.node), 6) << "  "
      << pad(host, host_w) << rpad(std::to_string(r.device), 8) << rpad(std::to_string(r.coord[Axis::dp]), 5)
      << rpad(std::to_string(r.coord[Axis::tp]), 5) << rpad(std::to_string(r.coord[Axis::pp]), 5)
      << (cp ? rpad(std::to_string(r.coord[Axis::cp]), 5) : std::string())
      << rpad(std::to_string(r.coord.ep), 5) << "\n";
}

void text_ranks(std::ostringstream& out, const Placement& p, const Cluster& cluster) {
  size_t host_w = 4;
  const bool cp = p.mesh.cp() > 1;
  for (const auto& n : cluster.nodes) host_w = std::max(host_w, n.host.size());
  out << rpad("rank", 5) << rpad("node", 6) << "  " << pad("host", host_w) << rpad("device", 8)
      << rpad("dp", 5) << rpad("tp", 5) << rpad("pp", 5) << (cp ? rpad("cp", 5) : std::string())
      << rpad("ep", 5) << "\n";
  const size_t n = p.ranks.size();
  const bool summarise = n > kTextRanksMax;
  for (size_t i = 0; i < n; ++i) {
    if (summarise && i == kRanksHead) {
      out << "  ... " << (n - kRanksHead - kRanksTail)
          << " ranks not shown (--format json lists every rank)\n";
      i = n - kRanksTail;
    }
    text_rank_row(out, p.ranks[i], cluster, host_w, cp);
  }
}

// "[0, 8, 16]", or for a long group "[0, 8, 16, 24, ..., 4088] (512 ranks)".
std::string group_ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() <= kGroupRanksShown) return "[" + detail::join_ints(ranks, ", ") + "]";
  std::vector<int> head(ranks.begin(), ranks.begin() + 4);
  std::vector<int> tail(ranks.end() - 2, ranks.end());
  return "[" + detail::join_ints(head, ", ") + ", ..., " + detail::join_ints(tail, ", ") + "] (" +
         std::to_string(ranks.size()) + " ranks)";
}

void text_groups(std::ostringstream& out, const Placement& p) {
  const bool summarise = p.ranks.size() > kTextRanksMax;
  std::vector<std::string> ranks;
  size_t w = 5;
  for (const auto& g : p.groups) {
    ranks.push_back(group_ranks_text(g.ranks));
    w = std::max(w, ranks.back().size());
  }
  out << pad("axis", 6) << pad("ranks", w + 2) << pad("tier", 10) << "bytes/step\n";
  bool skipped = false;
  // Per axis: groups listed, and of the rest, how many per link tier.
  std::map<std::string, size_t> listed;
  std::map<std::string, std::map<std::string, size_t>> hidden;
  std::vector<std::string> axis_order;
  for (size_t i = 0; i < p.groups.size(); ++i) {
    const Group& g = p.groups[i];
    if (g.ranks.size() < 2) {
      skipped = true;  // a one-rank group moves nothing over any link
      continue;
    }
    if (!listed.count(g.axis) && !hidden.count(g.axis)) axis_order.push_back(g.axis);
    if (summarise && listed[g.axis] >= kGroupsPerAxisShown) {
      ++hidden[g.axis][link_tier_name(g.tier)];
      continue;
    }
    ++listed[g.axis];
    out << pad(g.axis, 6) << pad(ranks[i], w + 2) << pad(link_tier_name(g.tier), 10)
        << human_bytes(g.bytes_per_step) << "\n";
  }
  for (const auto& axis : axis_order) {
    if (!hidden.count(axis)) continue;
    size_t total = 0;
    std::string tiers;
    for (const auto& [tier, count] : hidden[axis]) {
      total += count;
      tiers += (tiers.empty() ? "" : ", ") + std::to_string(count) + " over " + tier;
    }
    out << "  ... " << total << " more " << axis << " groups (" << tiers
        << "; --format json lists every group)\n";
  }
  if (skipped) out << "(axes of size 1 have one-rank groups that move nothing; not listed)\n";
}

}  // namespace

std::string placement_to_text(const Placement& placement, const Cluster& cluster) {
  std::ostringstream out;
  out << mesh_line(placement) << ", " << cluster.nodes.size() << " node"
      << (cluster.nodes.size() == 1 ? "" : "s") << "\n\n";
  text_ranks(out, placement, cluster);
  out << "\n";
  text_groups(out, placement);
  out << "\nwarnings:" << (placement.warnings.empty() ? " none\n" : "\n");
  for (const auto& w : placement.warnings) out << "  - " << w << "\n";
  return out.str();
}

std::string placement_to_json(const Placement& placement) {
  using nlohmann::ordered_json;
  const mesh::Mesh& m = placement.mesh;
  const bool cp = m.cp() > 1;  // cp and order appear when they change anything
  ordered_json j;
  j["world"] = m.world();
  j["mesh"] = {{"dp", m.dp()}, {"tp", m.tp()}, {"pp", m.pp()}};
  if (cp) j["mesh"]["cp"] = m.cp();
  j["mesh"]["ep"] = m.ep;
  if (m.order != mesh::kDefaultOrder) j["mesh"]["order"] = mesh::format_order(m.order);
  j["ranks"] = ordered_json::array();
  for (const auto& r : placement.ranks) {
    ordered_json row = {{"rank", r.rank}, {"node", r.node}, {"device", r.device}, {"dp", r.coord[Axis::dp]},
                        {"tp", r.coord[Axis::tp]}, {"pp", r.coord[Axis::pp]}};
    if (cp) row["cp"] = r.coord[Axis::cp];
    row["ep"] = r.coord.ep;
    j["ranks"].push_back(row);
  }
  j["groups"] = ordered_json::array();
  for (const auto& g : placement.groups)
    j["groups"].push_back({{"axis", g.axis}, {"ranks", g.ranks},
                           {"tier", link_tier_name(g.tier)}, {"bytes_per_step", g.bytes_per_step}});
  j["warnings"] = placement.warnings;
  return j.dump(2) + "\n";
}

// ---- SVG -------------------------------------------------------------------
namespace {

constexpr int kBoxW = 64, kBoxH = 36, kGap = 10, kPerRow = 4, kMargin = 20;
constexpr int kNodeHeader = 44, kStageHeader = 40;  // node header leaves room for DP arcs
const char* kPalette[] = {"#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
                          "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};

struct SvgLayout {
  std::vector<int> x, y;  // top-left of each rank's device box
  std::vector<int> band_y, band_h;
  int col_w = 0, width = 0, height = 0;
};

// Columns are PP stages; each node is a horizontal band; inside a (node,
// stage) cell the node's devices of that stage sit in rows of kPerRow.
SvgLayout svg_layout(const Placement& p, int nodes) {
  SvgLayout L;
  std::map<std::pair<int, int>, std::vector<int>> cell;  // (node, stage) -> ranks
  for (const auto& r : p.ranks) cell[{r.node, r.coord[Axis::pp]}].push_back(r.rank);
  int widest = 1;
  std::vector<int> rows(nodes, 1);
  for (auto& [key, ranks] : cell) {
    widest = std::max(widest, std::min(kPerRow, static_cast<int>(ranks.size())));
    rows[key.first] = std::max(rows[key.first], (static_cast<int>(ranks.size()) + kPerRow - 1) / kPerRow);
  }
  L.col_w = widest * (kBoxW + kGap) + 3 * kGap;
  L.x.resize(p.ranks.size());
  L.y.resize(p.ranks.size());
  int y = kMargin + kStageHeader;
  for (int n = 0; n < nodes; ++n) {
    L.band_y.push_back(y);
    L.band_h.push_back(kNodeHeader + rows[n] * (kBoxH + kGap) + kGap);
    y += L.band_h.back() + 2 * kGap;
  }
  for (auto& [key, ranks] : cell)
    for (size_t i = 0; i < ranks.size(); ++i) {
      L.x[ranks[i]] = kMargin + 2 * kGap + key.second * L.col_w + static_cast<int>(i % kPerRow) * (kBoxW + kGap);
      L.y[ranks[i]] = L.band_y[key.first] + kNodeHeader + static_cast<int>(i / kPerRow) * (kBoxH + kGap);
    }
  L.width = 2 * kMargin + p.mesh.pp() * L.col_w + 2 * kGap;
  L.height = y + kMargin;
  return L;
}

// Where labels already are (text estimated at 0.6 em a character, 1 em
// tall, baseline at 0.8 em; device boxes as drawn): a link label moves up
// from its arc's apex, a line at a time, until it covers none of them.
struct Box {
  double x0, y0, x1, y1;
  bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

Box text_box(double x, double y, double size, size_t chars, bool middle) {
  const double w = 0.6 * size * double(chars);
  const double left = middle ? x - w / 2 : x;
  return {left, y - 0.8 * size, left + w, y + 0.2 * size};
}

double free_baseline(const std::vector<Box>& taken, double x, double y, double size, size_t chars) {
  for (int tries = 0; tries < 200; ++tries, y -= size + 1) {
    const Box b = text_box(x, y, size, chars, true);
    if (std::none_of(taken.begin(), taken.end(), [&](const Box& t) { return t.overlaps(b); })) return y;
  }
  return y;
}

// An edge between device centres: straight across stages, an arc over the
// row when both ends sit in one row (so it does not hide behind the boxes
// between them). Returns the arc's apex, where its label would go.
std::pair<int, int> svg_edge(std::ostringstream& lines, const SvgLayout& L, int a, int b, bool dashed) {
  int x1 = L.x[a] + kBoxW / 2, y1 = L.y[a] + kBoxH / 2, x2 = L.x[b] + kBoxW / 2, y2 = L.y[b] + kBoxH / 2;
  int mx = (x1 + x2) / 2, my = (y1 + y2) / 2, lift = y1 == y2 ? 2 * kBoxH : 0;
  lines << "<path d=\"M " << x1 << " " << y1 << " Q " << mx << " " << my - lift << " " << x2 << " " << y2
        << "\" fill=\"none\" stroke=\"" << (dashed ? "#888" : "#333") << "\" stroke-width=\"1.5\""
        << (dashed ? " stroke-dasharray=\"4 3\"" : "") << "/>\n";
  return {mx, my - lift / 2 - 3};
}

// Each group's links, its tier labelled once per group (where the tier
// changes along the group, again), placed where no other label is.
void svg_links(std::ostringstream& out, std::ostringstream& labels, std::vector<Box>& taken, const Placement& p,
               const SvgLayout& L, const std::function<LinkTier(int, int)>& tier_of) {
  constexpr double kLabelSize = 9;
  for (const auto& g : p.groups) {
    if (g.axis != "pp" && g.axis != "dp") continue;
    std::string last;
    for (size_t i = 1; i < g.ranks.size(); ++i) {
      const auto [x, y] = svg_edge(out, L, g.ranks[i - 1], g.ranks[i], g.axis == "dp");
      const std::string text = g.axis + " " + link_tier_name(tier_of(g.ranks[i - 1], g.ranks[i]));
      if (text == last) continue;
      last = text;
      const double at = free_baseline(taken, x, y, kLabelSize, text.size());
      taken.push_back(text_box(x, at, kLabelSize, text.size(), true));
      labels << "<text x=\"" << x << "\" y=\"" << at << "\" font-size=\"9\" text-anchor=\"middle\" fill=\"#a00\">"
             << text << "</text>\n";
    }
  }
}

}  // namespace

std::string placement_to_svg(const Placement& p, const Cluster& cluster) {
  int nodes = static_cast<int>(cluster.nodes.size());
  SvgLayout L = svg_layout(p, nodes);
  std::vector<detail::Slot> slots = detail::cluster_slots(cluster);
  std::vector<int> first_slot(nodes, 0);
  for (int n = 1; n < nodes; ++n) first_slot[n] = first_slot[n - 1] + cluster.nodes[n - 1].devices;
  auto slot = [&](int r) { return slots[first_slot[p.ranks[r].node] + p.ranks[r].device]; };
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << L.width << "\" height=\"" << L.height
      << "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::vector<Box> taken;  // every label and device box drawn so far
  const std::string title = "dtrain topo: " + mesh_line(p) + " (colour = TP group, solid = PP, dashed = DP)";
  out << "<text x=\"" << kMargin << "\" y=\"" << kMargin << "\" font-size=\"14\">" << title << "</text>\n";
  taken.push_back(text_box(kMargin, kMargin, 14, title.size(), false));
  for (int s = 0; s < p.mesh.pp(); ++s) {
    const int x = kMargin + 2 * kGap + s * L.col_w, y = kMargin + kStageHeader - 8;
    out << "<text x=\"" << x << "\" y=\"" << y << "\" font-size=\"12\" font-weight=\"bold\">stage " << s << "</text>\n";
    taken.push_back(text_box(x, y, 12, 6 + std::to_string(s).size(), false));
  }
  for (int n = 0; n < nodes; ++n) {
    const std::string head = "node " + std::to_string(n) + " (" + cluster.nodes[n].host +
                             (cluster.nodes[n].gpu ? ", gpu" : ", cpu") + ")";
    out << "<rect x=\"" << kMargin << "\" y=\"" << L.band_y[n] << "\" width=\"" << L.width - 2 * kMargin
        << "\" height=\"" << L.band_h[n] << "\" rx=\"6\" fill=\"#f4f4f4\" stroke=\"#555\"/>\n"
        << "<text x=\"" << kMargin + 6 << "\" y=\"" << L.band_y[n] + 15 << "\" font-size=\"12\">" << head << "</text>\n";
    taken.push_back(text_box(kMargin + 6, L.band_y[n] + 15, 12, head.size(), false));
  }
  for (const auto& r : p.ranks)
    taken.push_back({double(L.x[r.rank]), double(L.y[r.rank]), double(L.x[r.rank] + kBoxW), double(L.y[r.rank] + kBoxH)});
  std::ostringstream labels;
  svg_links(out, labels, taken, p, L,
            [&](int a, int b) { return detail::link_between(slot(a), slot(b)); });
  for (const auto& r : p.ranks)
    out << "<rect x=\"" << L.x[r.rank] << "\" y=\"" << L.y[r.rank] << "\" width=\"" << kBoxW << "\" height=\""
        << kBoxH << "\" rx=\"4\" fill=\"" << kPalette[(r.rank / p.mesh.tp()) % 12] << "\" stroke=\"#222\"/>\n"
        << "<text x=\"" << L.x[r.rank] + kBoxW / 2 << "\" y=\"" << L.y[r.rank] + 15
        << "\" font-size=\"11\" text-anchor=\"middle\">rank " << r.rank << "</text>\n"
        << "<text x=\"" << L.x[r.rank] + kBoxW / 2 << "\" y=\"" << L.y[r.rank] + 29
        << "\" font-size=\"9\" text-anchor=\"middle\">dev " << r.device << " dp" << r.coord[Axis::dp] << " tp" << r.coord[Axis::tp]
        << "</text>\n";
  out << labels.str() << "</svg>\n";
  return out.str();
}

}  // namespace dtrain::rendezvous
