// Protobuf <-> plain-struct conversions (rendezvous_proto.h). Field by field;
// no policy here.
#include "rendezvous/rendezvous_proto.h"

#include <algorithm>

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

void to_proto(const ClosedRound& c, int node_rank, pb::JoinReply* out) {
  const Mesh& mesh = c.placement.mesh;
  out->set_round(c.round);
  out->set_restart(c.restart);
  out->set_node_rank(node_rank);
  out->set_num_nodes(static_cast<int>(c.node_ids.size()));
  out->set_dp(mesh.dp);
  out->set_tp(mesh.tp);
  out->set_pp(mesh.pp);
  out->set_ep(mesh.ep);
  out->mutable_ranks()->Reserve(static_cast<int>(c.placement.ranks.size()));
  for (const RankPlacement& r : c.placement.ranks) {
    pb::RankInfo* p = out->add_ranks();
    p->set_rank(r.rank);
    p->set_node(r.node);
    p->set_device(r.device);
    p->set_dp(r.dp);
    p->set_tp(r.tp);
    p->set_pp(r.pp);
    p->set_ep(r.ep);
  }
  for (const Group& g : c.placement.groups) {
    pb::GroupInfo* p = out->add_groups();
    p->set_axis(g.axis);
    p->mutable_ranks()->Add(g.ranks.begin(), g.ranks.end());
    p->set_tier(static_cast<int>(g.tier));
    p->set_bytes_per_step(g.bytes_per_step);
  }
  for (const auto& w : c.placement.warnings) out->add_warnings(w);
  out->set_master_addr(c.master_addr);
  out->set_master_port(c.master_port);
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
  a.placement.mesh = a.mesh;
  a.placement.ranks.reserve(static_cast<size_t>(reply.ranks_size()));
  for (const pb::RankInfo& p : reply.ranks()) {
    RankPlacement r;
    r.rank = p.rank();
    r.node = p.node();
    r.device = p.device();
    r.dp = p.dp();
    r.tp = p.tp();
    r.pp = p.pp();
    r.ep = p.ep();
    a.placement.ranks.push_back(r);
    if (r.node == a.node_rank) a.local_ranks.push_back(r);
  }
  std::sort(a.local_ranks.begin(), a.local_ranks.end(),
            [](const RankPlacement& x, const RankPlacement& y) { return x.device < y.device; });
  for (const pb::GroupInfo& p : reply.groups()) {
    Group g;
    g.axis = p.axis();
    g.ranks.assign(p.ranks().begin(), p.ranks().end());
    g.tier = static_cast<LinkTier>(p.tier());
    g.bytes_per_step = p.bytes_per_step();
    a.placement.groups.push_back(std::move(g));
  }
  a.placement.warnings.assign(reply.warnings().begin(), reply.warnings().end());
  a.master_addr = reply.master_addr();
  a.master_port = reply.master_port();
  return a;
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
