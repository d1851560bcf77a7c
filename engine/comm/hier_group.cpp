// The hierarchical all-reduce (hier_group.h). Stages of one all-reduce of t,
// all on the links' thread, in submission order (the same on every member):
//   1. node:    the leader's t = sum of the node's members' t (shared
//               memory: in the node's member order, whatever the arrival
//               order; the others' t unchanged, no copy out of the sum);
//   2. leaders: t = Gloo all-reduce of the node sums over the leaders
//               (its fixed ring order; the node order is the group order);
//   3. node:    the leader's t to every member of its node (shared memory).
// Members on one node never touch the network; each node puts one copy of
// the buffer on it instead of one per rank.
#include "engine/comm/hier_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>

#include "common/log.h"
#include "engine/comm/forwarding_group.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/shm_symmetric.h"

namespace dtrain::engine::comm::detail {

struct HierLinks {
  std::unique_ptr<Group> node;     // this node's members, leader = index 0
  std::unique_ptr<Group> leaders;  // null on members that are not their node's leader
  TaskThread thread;               // runs the stages; destroyed first (declared last)

  void all_reduce(at::Tensor& t) {
    // Only the leader needs the node's sum: no one copies it out.
    if (!shm_reduce_to_first(*node, t)) node->all_reduce(t);
    if (leaders) leaders->all_reduce(t);
    node->broadcast(t, 0, /*async=*/false);
  }
};

namespace {

std::string text_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

bool hier_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kInt || t == at::kLong;
}

// Every member's node (GROUP_RANK), exchanged through the store.
std::vector<int> member_nodes(const Group& g, c10d::Store& store, const std::string& key, int node) {
  const std::string me = std::to_string(node);
  store.set(key + "node/" + std::to_string(g.rank()), std::vector<uint8_t>(me.begin(), me.end()));
  std::vector<int> nodes;
  for (int i = 0; i < g.size(); ++i)
    nodes.push_back(std::stoi(text_of(store.get(key + "node/" + std::to_string(i)))));
  return nodes;
}

class HierWork : public Work {
 public:
  explicit HierWork(std::shared_future<void> fut) : fut_(std::move(fut)) {}
  void wait() override { fut_.get(); }  // rethrows the stage's dtrain::Error

 private:
  std::shared_future<void> fut_;
};

class HierGroup : public ForwardingGroup {
 public:
  HierGroup(std::unique_ptr<Group> inner, std::shared_ptr<HierLinks> links)
      : ForwardingGroup(std::move(inner)), links_(std::move(links)) {}

  std::string path() const override { return "shm+gloo"; }

  WorkPtr all_reduce(at::Tensor& t, bool async, ReduceOp op) override {
    if (op != ReduceOp::sum || !hier_dtype(t.scalar_type()) || !t.device().is_cpu() ||
        !t.is_contiguous() || t.numel() == 0)
      return inner_->all_reduce(t, async, op);
    // The flat ring's figure, as every Group counts an all-reduce.
    const int n = size();
    bytes_ += static_cast<uint64_t>(2 * (n - 1) * static_cast<int64_t>(t.nbytes()) / n);
    auto links = links_;
    // A range of a symmetric buffer of the node (symmetric_buffer.h): both
    // node stages in place, nothing staged or copied out.
    std::shared_ptr<SymmetricSegment> sym = symmetric_holding(*links->node, t);
    auto work = std::make_shared<HierWork>(links->thread.submit([links, t, sym]() mutable {
      if (sym)
        symmetric_hier_all_reduce(*sym, t, [&](at::Tensor& x) {
          if (links->leaders) links->leaders->all_reduce(x);
        });
      else
        links->all_reduce(t);
    }));
    if (!async) work->wait();
    return work;
  }
  void barrier() override {
    links_->thread.drain();
    inner_->barrier();
  }
  uint64_t bytes_sent() const override { return inner_->bytes_sent() + bytes_.load(); }
  void reset_bytes_sent() override {
    inner_->reset_bytes_sent();
    bytes_.store(0);
  }
  Group& node() const { return *links_->node; }

 private:
  std::shared_ptr<HierLinks> links_;
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace

std::shared_ptr<HierLinks> make_hier_links(const Group& g, const GroupContext& ctx,
                                           const std::string& key, const ShmOptions& shm) {
  if (g.size() < 3) return nullptr;  // two nodes with one rank each at least
  std::vector<int> nodes;
  try {
    nodes = member_nodes(g, *ctx.store, key, shm.node);
  } catch (...) {
    rethrow_comm_error(g.name(), "exchanging the members' nodes");
  }
  std::vector<int> distinct = nodes;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() < 2 || distinct.size() == nodes.size()) return nullptr;
  // This node's members and every node's leader, in group order.
  std::vector<int> local, leaders;
  std::map<int, bool> seen;
  int my_index = -1, leader_index = -1;
  for (int i = 0; i < g.size(); ++i) {
    if (nodes[i] == shm.node) {
      if (i == g.rank()) my_index = static_cast<int>(local.size());
      local.push_back(g.global_ranks()[i]);
    }
    if (!seen[nodes[i]]) {
      seen[nodes[i]] = true;
      if (i == g.rank()) leader_index = static_cast<int>(leaders.size());
      leaders.push_back(g.global_ranks()[i]);
    }
  }
  auto links = std::make_shared<HierLinks>();
  const std::string node_key = key + "node" + std::to_string(shm.node);
  auto node_pg = make_pg("gloo", node_key, my_index, static_cast<int>(local.size()), ctx);
  links->node = make_group("gloo", g.name() + ".node", local, my_index, node_pg, 0, ctx);
  links->node = with_shm_collectives(std::move(links->node), ctx.store, node_key + "/shm", shm);
  if (leader_index >= 0) {
    auto pg = make_pg("gloo", key + "leaders", leader_index, static_cast<int>(leaders.size()), ctx);
    links->leaders = make_group("gloo", g.name() + ".leaders", leaders, leader_index, pg, 0, ctx);
  }
  if (g.rank() == 0)
    DTRAIN_INFO("group {} ({} ranks on {} nodes): sum all-reduces are hierarchical: {} inside "
                "each node, Gloo across the {} node leaders",
                g.name(), g.size(), distinct.size(), links->node->path(), leaders.size());
  return links;
}

bool is_hier_group(const Group& g) { return dynamic_cast<const HierGroup*>(&g) != nullptr; }

Group* hier_node_group(Group& g) {
  auto* h = dynamic_cast<HierGroup*>(&g);
  return h ? &h->node() : nullptr;
}

std::unique_ptr<Group> with_hier_all_reduce(std::unique_ptr<Group> inner,
                                            std::shared_ptr<HierLinks> links) {
  if (!links) return inner;
  return std::make_unique<HierGroup>(std::move(inner), std::move(links));
}

}  // namespace dtrain::engine::comm::detail
