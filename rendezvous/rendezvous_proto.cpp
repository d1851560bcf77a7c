// Protobuf <-> plain-struct conversions (rendezvous_proto.h). Field by field;
// no policy here.
#include "rendezvous/rendezvous_proto.h"

#include <algorithm>

#include "common/error.h"

namespace dtrain::rendezvous::detail {

void to_proto(const JoinInfo& info, double timeout_s, pb::JoinRequest* out) {
  out->mutable_auth()->set_job(info.job);
  out->mutable_auth()->set_token(info.token);
  out->set_node_id(info.node_id);
  out->set_host(info.host);
  out->set_slots(info.slots);
  out->set_node_rank(info.node_rank);
  out->set_gpu(info.gpu);
  for (int id : info.island_of_device) out->add_island_of_device(id);
  out->set_master_port(info.master_port);
  out->set_timeout_s(timeout_s);
}

JoinInfo from_proto(const pb::JoinRequest& req) {
  JoinInfo info;
  info.job = req.auth().job();
  info.node_id = req.node_id();
  info.host = req.host();
  info.slots = req.slots();
  info.node_rank = req.node_rank();
  info.gpu = req.gpu();
  info.island_of_device.assign(req.island_of_device().begin(), req.island_of_device().end());
  info.master_port = req.master_port();
  return info;
}

std::string placement_bytes(const Placement& placement) {
  pb::PlacementInfo info;
  auto* table = info.mutable_rank_table();
  table->Reserve(7 * static_cast<int>(placement.ranks.size()));
  for (const RankPlacement& r : placement.ranks)
    for (int v : {r.rank, r.node, r.device, r.dp, r.tp, r.pp, r.ep}) table->AddAlreadyReserved(v);
  for (const Group& g : placement.groups) {
    int axis = 0;
    while (axis < info.axis_names_size() && info.axis_names(axis) != g.axis) ++axis;
    if (axis == info.axis_names_size()) info.add_axis_names(g.axis);
    info.add_group_axis(axis);
    info.add_group_size(static_cast<int>(g.ranks.size()));
    info.mutable_group_ranks()->Add(g.ranks.begin(), g.ranks.end());
    info.add_group_tier(static_cast<int>(g.tier));
    info.add_group_bytes(g.bytes_per_step);
  }
  for (const auto& w : placement.warnings) info.add_warnings(w);
  return info.SerializeAsString();
}

void to_proto(const ClosedRound& c, int node_rank, const std::string& placement,
              pb::JoinReply* out) {
  const Mesh& mesh = c.placement.mesh;
  out->set_round(c.round);
  out->set_restart(c.restart);
  out->set_node_rank(node_rank);
  out->set_num_nodes(static_cast<int>(c.node_ids.size()));
  out->set_dp(mesh.dp);
  out->set_tp(mesh.tp);
  out->set_pp(mesh.pp);
  out->set_ep(mesh.ep);
  out->set_master_addr(c.master_addr);
  out->set_master_port(c.master_port);
  out->set_placement(placement);
}

Assignment from_proto(const pb::JoinReply& reply) {
  Assignment a;
  a.round = reply.round();
  a.restart = reply.restart();
  a.node_rank = reply.node_rank();
  a.num_nodes = reply.num_nodes();
  a.mesh.dp = reply.dp();
  a.mesh.tp = reply.tp();
  a.mesh.pp = reply.pp();
  a.mesh.ep = reply.ep();
  a.world = a.mesh.world();
  a.master_addr = reply.master_addr();
  a.master_port = reply.master_port();
  a.placement.mesh = a.mesh;
  parse_placement(reply.placement(), &a);
  return a;
}

namespace {

[[noreturn]] void bad_placement() {
  throw Error(ErrorCode::rendezvous, "the rendezvous server sent a malformed placement",
              "run the same dtrain version on every node and on the server");
}

}  // namespace

void parse_placement(const std::string& bytes, Assignment* out) {
  Assignment& a = *out;
  pb::PlacementInfo info;
  if (!info.ParseFromString(bytes)) bad_placement();
  int groups = info.group_axis_size();
  if (info.rank_table_size() % 7 != 0 || info.group_size_size() != groups ||
      info.group_tier_size() != groups || info.group_bytes_size() != groups)
    bad_placement();
  const auto& t = info.rank_table();
  a.placement.ranks.reserve(static_cast<size_t>(t.size() / 7));
  for (int i = 0; i + 7 <= t.size(); i += 7) {
    RankPlacement r{t[i], t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6]};
    a.placement.ranks.push_back(r);
    if (r.node == a.node_rank) a.local_ranks.push_back(r);
  }
  std::sort(a.local_ranks.begin(), a.local_ranks.end(),
            [](const RankPlacement& x, const RankPlacement& y) { return x.device < y.device; });
  a.placement.groups.resize(static_cast<size_t>(groups));
  const int* next = info.group_ranks().data();
  const int* end = next + info.group_ranks_size();
  for (int i = 0; i < groups; ++i) {
    Group& g = a.placement.groups[static_cast<size_t>(i)];
    int axis = info.group_axis(i), size = info.group_size(i);
    if (axis < 0 || axis >= info.axis_names_size() || size < 0 || end - next < size)
      bad_placement();
    g.axis = info.axis_names(axis);
    g.ranks.assign(next, next + size);
    next += size;
    g.tier = static_cast<LinkTier>(info.group_tier(i));
    g.bytes_per_step = info.group_bytes(i);
  }
  a.placement.warnings.assign(info.warnings().begin(), info.warnings().end());
}

void to_proto(const FailureReport& r, pb::FailureRequest* out) {
  out->set_node_id(r.node_id);
  out->set_round(r.round);
  out->set_rank(r.rank);
  out->set_local_rank(r.local_rank);
  out->set_exit_code(r.exit_code);
  out->set_signal(r.signal);
  out->set_message(r.message);
}

FailureReport from_proto(const pb::FailureRequest& req) {
  FailureReport r;
  r.node_id = req.node_id();
  r.round = req.round();
  r.rank = req.rank();
  r.local_rank = req.local_rank();
  r.exit_code = req.exit_code();
  r.signal = req.signal();
  r.message = req.message();
  return r;
}

void to_proto(const ServerStatus& s, pb::StatusReply* out) {
  out->set_job(s.job);
  out->set_round(s.round);
  out->set_restart(s.restart);
  out->set_min_nodes(s.min_nodes);
  out->set_max_nodes(s.max_nodes);
  out->set_round_open(s.round_open);
  for (const NodeStatus& n : s.nodes) {
    pb::NodeStatusInfo* p = out->add_nodes();
    p->set_node_id(n.node_id);
    p->set_host(n.host);
    p->set_node_rank(n.node_rank);
    p->set_last_heartbeat_age_s(n.last_heartbeat_age_s);
  }
}

ServerStatus from_proto(const pb::StatusReply& r) {
  ServerStatus s;
  s.job = r.job();
  s.round = r.round();
  s.restart = r.restart();
  s.min_nodes = r.min_nodes();
  s.max_nodes = r.max_nodes();
  s.round_open = r.round_open();
  for (const pb::NodeStatusInfo& p : r.nodes())
    s.nodes.push_back({p.node_id(), p.host(), p.node_rank(), p.last_heartbeat_age_s()});
  return s;
}

}  // namespace dtrain::rendezvous::detail
