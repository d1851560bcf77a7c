// RoundState: closing a round. Orders the joiners into nodes, builds the
// cluster from what they reported, runs place_ranks (the same function
// `dtrain topo` uses) and logs the round's summary block.
#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "common/spec_resolve.h"
#include "rendezvous/round_state.h"

namespace dtrain::rendezvous {

// Requested node ranks first (at their index), then the others in join order
// fill the gaps; a requested rank past the round's size (elastic) goes last.
std::vector<Member> RoundState::ordered_waiting() const {
  size_t n = waiting_.size();
  std::vector<const Member*> slot(n, nullptr);
  std::vector<const Member*> rest;
  for (const Member& m : waiting_) {
    int r = m.info.node_rank;
    if (r >= 0 && static_cast<size_t>(r) < n && !slot[static_cast<size_t>(r)])
      slot[static_cast<size_t>(r)] = &m;
    else if (r < 0)
      rest.push_back(&m);
  }
  std::vector<const Member*> late;
  for (const Member& m : waiting_)
    if (m.info.node_rank >= 0 && static_cast<size_t>(m.info.node_rank) >= n) late.push_back(&m);
  std::stable_sort(late.begin(), late.end(), [](const Member* a, const Member* b) {
    return a->info.node_rank < b->info.node_rank;
  });
  rest.insert(rest.end(), late.begin(), late.end());
  std::vector<Member> out;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) out.push_back(slot[i] ? *slot[i] : *rest[next++]);
  return out;
}

// Uniform nodes that report no islands get exactly make_cluster's layout (what
// `dtrain topo` shows for the spec); otherwise each node's island ids are made
// globally unique (a reported id is local to its node).
Cluster RoundState::cluster_of(const std::vector<Member>& members) const {
  const JoinInfo& first = members.front().info;
  bool uniform = std::all_of(members.begin(), members.end(), [&](const Member& m) {
    return m.info.slots == first.slots && m.info.gpu == first.gpu &&
           m.info.island_of_device.empty();
  });
  Cluster cluster;
  if (uniform) {
    cluster = make_cluster(static_cast<int>(members.size()), first.slots,
                           options_.nvlink_domain, first.gpu);
  } else {
    int next_island = 0;
    for (const Member& m : members) {
      std::vector<int> local = m.info.island_of_device;
      if (local.empty())
        local = make_cluster(1, m.info.slots, options_.nvlink_domain, m.info.gpu)
                    .nodes.front()
                    .island_of_device;
      std::map<int, int> global;
      NodeInfo node;
      node.devices = m.info.slots;
      node.gpu = m.info.gpu;
      for (int id : local) {
        auto it = global.find(id);
        if (it == global.end()) it = global.emplace(id, next_island++).first;
        node.island_of_device.push_back(it->second);
      }
      cluster.nodes.push_back(node);
    }
  }
  for (size_t i = 0; i < members.size() && i < cluster.nodes.size(); ++i)
    cluster.nodes[i].host = members[i].info.host;
  return cluster;
}

// Fixed size: the spec's mesh. Elastic: dp scales with the devices that
// joined (dp = devices / (tp * pp * cp)); the other axes stay as the spec says.
mesh::Mesh RoundState::mesh_for(const Cluster& cluster) const {
  mesh::Mesh mesh = options_.mesh;
  if (!elastic()) return checked_global_batch(mesh);
  int devices = cluster.total_devices();
  int per_replica = mesh.world() / mesh.dp();
  if (devices % per_replica != 0)
    throw Error(ErrorCode::config,
                "elastic round: " + std::to_string(devices) + " devices joined, not a multiple of "
                "tp(" + std::to_string(mesh.tp()) + ") * pp(" + std::to_string(mesh.pp()) + ")" +
                (mesh.cp() > 1 ? " * cp(" + std::to_string(mesh.cp()) + ")" : std::string()) + " = " +
                std::to_string(per_replica),
                "give every node a multiple of tp * pp slots");
  mesh.size(mesh::Axis::dp) = devices / per_replica;
  return checked_global_batch(mesh);
}

// train.global_batch holds at every round's dp (grad_accum auto re-derives
// it), or the round is refused.
mesh::Mesh RoundState::checked_global_batch(const mesh::Mesh& mesh) const {
  const int gbs = options_.global_batch;
  if (gbs <= 0) return mesh;
  std::string why;
  if (options_.grad_accum_auto && auto_grad_accum(gbs, options_.micro_batch, mesh.dp(), &why) == 0)
    throw Error(ErrorCode::config, why, "choose a train.global_batch that every round's dp divides");
  const long long fixed = 1LL * options_.micro_batch * options_.grad_accum * mesh.dp();
  if (!options_.grad_accum_auto && fixed != gbs)
    throw Error(ErrorCode::config,
                "train.micro_batch(" + std::to_string(options_.micro_batch) + ") x train.grad_accum(" +
                    std::to_string(options_.grad_accum) + ") x dp(" + std::to_string(mesh.dp()) + ") = " +
                    std::to_string(fixed) + " != train.global_batch(" + std::to_string(gbs) + ")",
                "set train.grad_accum: auto so that every round keeps the global batch");
  return mesh;
}

std::vector<JoinOutcome> RoundState::close_round(TimePoint now) {
  std::vector<Member> members = ordered_waiting();
  std::vector<JoinOutcome> out;
  auto closed = std::make_shared<ClosedRound>();
  closed->round = round_;
  closed->restart = restart_;
  try {
    Cluster cluster = cluster_of(members);
    closed->placement = place_ranks(cluster, mesh_for(cluster), options_.traffic,
                                    options_.allow_slow);
  } catch (const Error& e) {
    // Nobody can run this round: tell every joiner why; the round stays open.
    std::string msg = "round " + std::to_string(round_) + " cannot be placed: " + e.message() +
                      (e.hint().empty() ? "" : " (fix: " + e.hint() + ")");
    DTRAIN_ERROR("rendezvous: {}", msg);
    for (const Member& m : members)
      out.push_back({m.ticket, {RefusalKind::precondition, msg}, nullptr, 0});
    clear_waiting();
    return out;
  }
  const Member& host0 =
      members[closed->placement.ranks.empty()
                  ? 0
                  : static_cast<size_t>(closed->placement.ranks.front().node)];
  closed->master_addr = host0.info.host;
  closed->master_port = host0.info.master_port > 0 ? host0.info.master_port : 29500;
  for (size_t i = 0; i < members.size(); ++i) {
    members[i].info.node_rank = static_cast<int>(i);
    members[i].last_beat = now;
    members[i].expiry = TimePoint::max();
    closed->node_ids.push_back(members[i].info.node_id);
    out.push_back({members[i].ticket, {}, closed, static_cast<int>(i)});
  }
  set_active(std::move(members));
  clear_waiting();
  open_ = false;
  last_closed_ = closed;
  progress_.clear();  // the new round's workers start their traces afresh
  progress_node_.clear();
  beat_at_.clear();
  computing_at_.clear();
  all_started_ = false;
  closed_at_ = now;
  failure_.clear();   // told to every member of the failed round before it re-joined
  last_progress_ = now;
  log_summary(*closed, active_);
  return out;
}

void RoundState::log_summary(const ClosedRound& c, const std::vector<Member>& members) {
  const mesh::Mesh& mesh = c.placement.mesh;
  std::string block = "rendezvous round " + std::to_string(c.round) + " closed (restart " +
                      std::to_string(c.restart) + "): " + std::to_string(members.size()) +
                      " nodes, world " + std::to_string(mesh.world()) + ", mesh " + mesh::describe(mesh) +
                      "\n  master " + c.master_addr + ":" + std::to_string(c.master_port);
  std::vector<std::vector<int>> ranks_of(members.size());
  for (const RankPlacement& r : c.placement.ranks)
    if (r.node >= 0 && static_cast<size_t>(r.node) < members.size())
      ranks_of[static_cast<size_t>(r.node)].push_back(r.rank);
  const size_t shown = 8;
  for (size_t i = 0; i < members.size() && i < shown; ++i) {
    const auto& rk = ranks_of[i];
    std::string range = rk.empty() ? "no ranks" : "ranks";
    for (size_t k = 0; k < rk.size() && k < 8; ++k) range += " " + std::to_string(rk[k]);
    if (rk.size() > 8) range += " ... (" + std::to_string(rk.size()) + ")";
    const std::string& name = members[i].info.hostname;
    block += "\n  node " + std::to_string(i) + ": " + members[i].info.host +
             (name.empty() ? "" : " (" + name + ")") + " ('" +
             members[i].info.node_id + "', " + std::to_string(members[i].info.slots) +
             " slots) " + range;
  }
  if (members.size() > shown)
    block += "\n  ... and " + std::to_string(members.size() - shown) + " more nodes";
  for (const auto& w : c.placement.warnings) block += "\n  warning: " + w;
  DTRAIN_INFO("{}", block);
}

}  // namespace dtrain::rendezvous
