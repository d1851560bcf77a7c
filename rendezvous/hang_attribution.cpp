// attribute_hang (hang_attribution.h). Members of the same process group
// enter its collectives in the same order, so "rank m never entered
// collective #k of group g" is: m's last entered sequence number on g < k.
#include "rendezvous/hang_attribution.h"

#include <algorithm>
#include <cstdio>

#include "common/mesh.h"

namespace dtrain::rendezvous {
namespace {

std::string list(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 16) return out + ", ... (" + std::to_string(v.size()) + ")";
    out += (i ? "," : "") + std::to_string(v[i]);
  }
  return out;
}

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1024.0 * 1024.0));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

uint64_t entered_on(const trace::RankProgress& p, const std::string& group) {
  for (const auto& [g, seq] : p.group_entered)
    if (g == group) return seq;
  return 0;
}

std::string where_text(const std::map<int, RankWhere>& where, int rank) {
  auto it = where.find(rank);
  if (it == where.end()) return "";
  const RankWhere& w = it->second;
  return " on node " + std::to_string(w.node) + " (" + w.host +
         (w.hostname.empty() ? "" : ", " + w.hostname) + ")";
}

}  // namespace

std::vector<int> group_members(const mesh::Mesh& m, const std::string& group, int rank) {
  if (group == "world" || group == "control") {
    std::vector<int> all(static_cast<size_t>(m.world()));
    for (int r = 0; r < m.world(); ++r) all[static_cast<size_t>(r)] = r;
    return all;
  }
  mesh::GroupKind kind{};
  if (!mesh::parse_group(group, &kind)) return {};
  return mesh::group_of(m, kind, rank);
}

HangReport attribute_hang(const mesh::Mesh& mesh, const std::map<int, trace::RankProgress>& ranks,
                          const std::map<int, RankWhere>& where, double stalled_s,
                          double hang_timeout_s, const std::string& bound_name) {
  HangReport h;
  // The collective (group, seq) most ranks wait in; ties: the lowest seq.
  std::map<std::pair<std::string, uint64_t>, std::vector<int>> waits;
  for (const auto& [rank, p] : ranks)
    if (p.waiting && p.pending.seq > 0) waits[{p.pending.group, p.pending.seq}].push_back(rank);
  h.text = "hang: no rank completed a collective for " + seconds(stalled_s) +
           " (" + bound_name + " = " + seconds(hang_timeout_s) + ")";
  if (waits.empty()) {
    h.text += "; no rank is inside a collective (all compute, or all stopped)";
    return h;
  }
  auto best = waits.begin();
  for (auto it = waits.begin(); it != waits.end(); ++it)
    if (it->second.size() > best->second.size()) best = it;
  h.waiting = true;
  h.group = best->first.first;
  h.seq = best->first.second;
  h.waiting_ranks = best->second;
  const trace::RankProgress& w0 = ranks.at(h.waiting_ranks.front());
  h.op = w0.pending.op;
  const std::vector<int> members = group_members(mesh, h.group, h.waiting_ranks.front());
  std::vector<int> unknown;
  for (int m : members) {
    auto it = ranks.find(m);
    if (it == ranks.end()) unknown.push_back(m);
    else if (entered_on(it->second, h.group) < h.seq) h.missing_ranks.push_back(m);
  }
  h.text += "\n  rank(s) " + list(h.waiting_ranks) + " wait in " + h.group + " " + h.op + " #" +
            std::to_string(h.seq) + " (" + bytes_text(w0.pending.bytes) + ", group " + h.group +
            " = ranks " + list(members) + ")";
  if (h.missing_ranks.empty()) {
    h.text += "\n  every reporting rank of the group entered it: the collective itself is stuck "
              "(a cut link, a dead peer)";
  } else {
    h.text += "\n  rank(s) " + list(h.missing_ranks) + " never entered it";
  }
  for (int m : h.missing_ranks) {
    const trace::RankProgress& p = ranks.at(m);
    h.text += "\n  rank " + std::to_string(m) + where_text(where, m) + ": step " +
              std::to_string(p.step) + ", phase " + p.phase + ", last completed collective: " +
              (p.has_done ? p.last_done.group + " " + p.last_done.op + " #" +
                                std::to_string(p.last_done.seq)
                          : std::string("none")) +
              (p.waiting ? "; now in " + p.pending.group + " " + p.pending.op +
                               (p.pending.seq ? " #" + std::to_string(p.pending.seq) : "")
                         : "");
  }
  if (!unknown.empty()) h.text += "\n  no progress reported by rank(s) " + list(unknown);
  return h;
}

}  // namespace dtrain::rendezvous
