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
  out->set_hostname(info.hostname);
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
  info.hostname = req.hostname();
  info.slots = req.slots();
  info.node_rank = req.node_rank();
  info.gpu = req.gpu();
  info.island_of_device.assign(req.island_of_device().begin(), req.island_of_device().end());
  info.master_port = req.master_port();
  return info;
}

namespace {

// Appends one group: a first rank and a stride when its ranks step evenly,
// else all of them.
// The step between a group's ranks when they step evenly (1 for one rank),
// else 0. O(size): computed once per group and round (PlacementIndex).
int group_stride(const Group& g) {
  const size_t size = g.ranks.size();
  int stride = size >= 2 ? g.ranks[1] - g.ranks[0] : 1;
  for (size_t k = 1; k < size && stride > 0; ++k)
    if (g.ranks[k] - g.ranks[k - 1] != stride) stride = 0;
  return stride;
}

// stride: group_stride(g). A node's reply carries the whole-world groups its
// ranks are in; sent as first rank and stride they cost O(1) each.
void add_group(const Group& g, int stride, pb::PlacementInfo* info) {
  int axis = 0;
  while (axis < info->axis_names_size() && info->axis_names(axis) != g.axis) ++axis;
  if (axis == info->axis_names_size()) info->add_axis_names(g.axis);
  info->add_group_axis(axis);
  const int size = static_cast<int>(g.ranks.size());
  info->add_group_size(size);
  if (size > 0 && stride > 0) {
    info->add_group_stride(stride);
    info->add_group_ranks(g.ranks.front());
  } else {
    info->add_group_stride(0);
    info->mutable_group_ranks()->Add(g.ranks.begin(), g.ranks.end());
  }
  info->add_group_tier(static_cast<int>(g.tier));
  info->add_group_bytes(g.bytes_per_step);
}

void add_rank(const RankPlacement& r, pb::PlacementInfo* info) {
  for (int v : {r.rank, r.node, r.device}) info->add_rank_table(v);
}

}  // namespace

PlacementIndex::PlacementIndex(const Placement& p) {
  int nodes = 0;
  for (const RankPlacement& r : p.ranks) nodes = std::max(nodes, r.node + 1);
  ranks_of_node.resize(static_cast<size_t>(nodes));
  groups_of_rank.resize(p.ranks.size());
  for (const RankPlacement& r : p.ranks)
    if (r.node >= 0) ranks_of_node[static_cast<size_t>(r.node)].push_back(r.rank);
  stride_of_group.reserve(p.groups.size());
  for (const Group& g : p.groups) stride_of_group.push_back(group_stride(g));
  for (size_t g = 0; g < p.groups.size(); ++g)
    for (int r : p.groups[g].ranks)
      if (r >= 0 && static_cast<size_t>(r) < groups_of_rank.size())
        groups_of_rank[static_cast<size_t>(r)].push_back(static_cast<int>(g));
}

std::string placement_bytes(const Placement& placement) {
  pb::PlacementInfo info;
  info.set_mesh(mesh::format_mesh(placement.mesh));
  info.mutable_rank_table()->Reserve(3 * static_cast<int>(placement.ranks.size()));
  for (const RankPlacement& r : placement.ranks) add_rank(r, &info);
  for (const Group& g : placement.groups) add_group(g, group_stride(g), &info);
  for (const auto& w : placement.warnings) info.add_warnings(w);
  return info.SerializeAsString();
}

std::string node_placement_bytes(const Placement& placement, const PlacementIndex& index, int node) {
  pb::PlacementInfo info;
  info.set_mesh(mesh::format_mesh(placement.mesh));
  info.set_node_only(true);
  std::vector<int> groups;
  if (node >= 0 && static_cast<size_t>(node) < index.ranks_of_node.size())
    for (int r : index.ranks_of_node[static_cast<size_t>(node)]) {
      add_rank(placement.ranks[static_cast<size_t>(r)], &info);
      const auto& of = index.groups_of_rank[static_cast<size_t>(r)];
      groups.insert(groups.end(), of.begin(), of.end());
    }
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  for (int g : groups)
    add_group(placement.groups[static_cast<size_t>(g)], index.stride_of_group[static_cast<size_t>(g)], &info);
  for (const auto& w : placement.warnings) info.add_warnings(w);
  return info.SerializeAsString();
}

void to_proto(const ClosedRound& c, int node_rank, const std::string& placement,
              pb::JoinReply* out) {
  out->set_round(c.round);
  out->set_restart(c.restart);
  out->set_node_rank(node_rank);
  out->set_num_nodes(static_cast<int>(c.node_ids.size()));
  out->set_mesh(mesh::format_mesh(c.placement.mesh));
  out->set_master_addr(c.master_addr);
  out->set_master_port(c.master_port);
  out->set_placement(placement);
}

namespace {

[[noreturn]] void bad_placement() {
  throw Error(ErrorCode::rendezvous, "the rendezvous server sent a malformed placement",
              "run the same dtrain version on every node and on the server");
}

}  // namespace

Assignment from_proto(const pb::JoinReply& reply) {
  Assignment a;
  a.round = reply.round();
  a.restart = reply.restart();
  a.node_rank = reply.node_rank();
  a.num_nodes = reply.num_nodes();
  std::string problem;
  if (!mesh::parse_mesh(reply.mesh(), &a.mesh, &problem)) bad_placement();
  a.world = a.mesh.world();
  a.master_addr = reply.master_addr();
  a.master_port = reply.master_port();
  a.placement.mesh = a.mesh;
  parse_placement(reply.placement(), &a);
  return a;
}

void parse_placement(const std::string& bytes, Placement* out) {
  Placement& p = *out;
  pb::PlacementInfo info;
  if (!info.ParseFromString(bytes)) bad_placement();
  const int groups = info.group_axis_size();
  const bool strides = info.group_stride_size() > 0;
  if (info.rank_table_size() % 3 != 0 || info.group_size_size() != groups ||
      info.group_tier_size() != groups || info.group_bytes_size() != groups ||
      (strides && info.group_stride_size() != groups))
    bad_placement();
  std::string problem;
  if (!info.mesh().empty() && !mesh::parse_mesh(info.mesh(), &p.mesh, &problem)) bad_placement();
  const auto& t = info.rank_table();
  p.ranks.clear();
  p.ranks.reserve(static_cast<size_t>(t.size() / 3));
  for (int i = 0; i + 3 <= t.size(); i += 3) {
    if (t[i] < 0 || t[i] >= p.mesh.world()) bad_placement();
    p.ranks.push_back({t[i], t[i + 1], t[i + 2], mesh::coord_of(p.mesh, t[i])});
  }
  p.groups.assign(static_cast<size_t>(groups), Group{});
  const int* next = info.group_ranks().data();
  const int* end = next + info.group_ranks_size();
  for (int i = 0; i < groups; ++i) {
    Group& g = p.groups[static_cast<size_t>(i)];
    const int axis = info.group_axis(i), size = info.group_size(i);
    const int stride = strides ? info.group_stride(i) : 0;
    const int listed = stride > 0 ? 1 : size;
    if (axis < 0 || axis >= info.axis_names_size() || size < 0 || stride < 0 || end - next < listed)
      bad_placement();
    g.axis = info.axis_names(axis);
    if (stride > 0) {
      g.ranks.resize(static_cast<size_t>(size));
      for (int k = 0; k < size; ++k) g.ranks[static_cast<size_t>(k)] = *next + k * stride;
    } else {
      g.ranks.assign(next, next + size);
    }
    next += listed;
    g.tier = static_cast<LinkTier>(info.group_tier(i));
    g.bytes_per_step = info.group_bytes(i);
  }
  p.warnings.assign(info.warnings().begin(), info.warnings().end());
}

void parse_placement(const std::string& bytes, Assignment* out) {
  Assignment& a = *out;
  parse_placement(bytes, &a.placement);
  a.local_ranks.clear();
  for (const RankPlacement& r : a.placement.ranks)
    if (r.node == a.node_rank) a.local_ranks.push_back(r);
  std::sort(a.local_ranks.begin(), a.local_ranks.end(),
            [](const RankPlacement& x, const RankPlacement& y) { return x.device < y.device; });
}

namespace {

void to_proto(const trace::Collective& c, pb::CollectiveInfo* out) {
  out->set_group(c.group);
  out->set_op(c.op);
  out->set_seq(c.seq);
  out->set_bytes(c.bytes);
}

trace::Collective from_proto(const pb::CollectiveInfo& c) {
  trace::Collective out;
  out.group = c.group();
  out.op = c.op();
  out.seq = c.seq();
  out.bytes = c.bytes();
  return out;
}

}  // namespace

void to_proto(const trace::RankProgress& p, pb::RankProgressInfo* out) {
  out->set_rank(p.rank);
  out->set_entered(p.entered);
  out->set_completed(p.completed);
  out->set_step(p.step);
  out->set_phase(p.phase);
  out->set_waiting(p.waiting);
  if (p.waiting) to_proto(p.pending, out->mutable_pending());
  out->set_has_done(p.has_done);
  if (p.has_done) to_proto(p.last_done, out->mutable_last_done());
  out->set_start_step(p.start_step);
  out->set_done_step(p.done_step);
  out->set_last_step_ns(p.last_step_ns);
  out->set_tokens_per_step(p.tokens_per_step);
  out->set_has_loss(p.has_loss);
  out->set_loss(p.loss);
  out->set_straggler_ratio(p.straggler_ratio);
  out->set_cpu_ns(p.cpu_ns);
  for (const auto& [group, seq] : p.group_entered) {
    out->add_group_names(group);
    out->add_group_entered(seq);
  }
}

trace::RankProgress from_proto(const pb::RankProgressInfo& p) {
  trace::RankProgress out;
  out.rank = p.rank();
  out.entered = p.entered();
  out.completed = p.completed();
  out.step = p.step();
  out.phase = p.phase();
  out.waiting = p.waiting();
  out.pending = from_proto(p.pending());
  out.has_done = p.has_done();
  out.last_done = from_proto(p.last_done());
  for (int i = 0; i < p.group_names_size() && i < p.group_entered_size(); ++i)
    out.group_entered.emplace_back(p.group_names(i), p.group_entered(i));
  out.start_step = p.start_step();
  out.done_step = p.done_step();
  out.last_step_ns = p.last_step_ns();
  out.tokens_per_step = p.tokens_per_step();
  out.has_loss = p.has_loss();
  out.loss = p.loss();
  out.straggler_ratio = p.straggler_ratio();
  out.cpu_ns = p.cpu_ns();
  return out;
}

void to_proto(const FailureReport& r, pb::FailureRequest* out) {
  out->set_node_id(r.node_id);
  out->set_round(r.round);
  out->set_rank(r.rank);
  out->set_local_rank(r.local_rank);
  out->set_exit_code(r.exit_code);
  out->set_signal(r.signal);
  out->set_message(r.message);
  out->set_failed_at(r.failed_at);
  out->set_permanent(r.permanent);
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
  r.failed_at = req.failed_at();
  r.permanent = req.permanent();
  return r;
}

void to_proto(const ServerStatus& s, pb::StatusReply* out) {
  out->set_job(s.job);
  out->set_round(s.round);
  out->set_restart(s.restart);
  out->set_min_nodes(s.min_nodes);
  out->set_max_nodes(s.max_nodes);
  out->set_round_open(s.round_open);
  out->set_failure(s.failure);
  out->set_stopped(s.stopped);
  out->set_waiting_heartbeats(s.waiting_heartbeats);
  for (const NodeStatus& n : s.nodes) {
    pb::NodeStatusInfo* p = out->add_nodes();
    p->set_node_id(n.node_id);
    p->set_host(n.host);
    p->set_node_rank(n.node_rank);
    p->set_last_heartbeat_age_s(n.last_heartbeat_age_s);
    p->set_hostname(n.hostname);
    for (const auto& r : n.ranks) to_proto(r, p->add_ranks());
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
  s.failure = r.failure();
  s.stopped = r.stopped();
  s.waiting_heartbeats = r.waiting_heartbeats();
  for (const pb::NodeStatusInfo& p : r.nodes()) {
    s.nodes.push_back({p.node_id(), p.host(), p.node_rank(), p.last_heartbeat_age_s(), p.hostname(), {}});
    for (const auto& rank : p.ranks()) s.nodes.back().ranks.push_back(from_proto(rank));
  }
  if (!r.placement().empty()) {
    s.has_placement = true;
    parse_placement(r.placement(), &s.placement);
  }
  return s;
}

}  // namespace dtrain::rendezvous::detail
