// init_comm: the TCPStore (rank 0 serves it at MASTER_ADDR:MASTER_PORT) and
// the process groups: the world on the data backend (CommOptions.backend),
// one group per mesh axis from common/mesh.h on that axis's backend
// (CommOptions.axis_backend, else the data backend), each over its own
// PrefixStore, and the control group (Gloo, world). Which groups exist and
// which connections they share is decided here; group_factory.cpp makes
// them. Gloo: one Gloo device for all groups, a group of one rank needs no
// connections, and one equal to the world on the world's backend shares the
// world's pg. NCCL groups live under "pg/nccl/..." (communicators are made at
// the first op). Control is the world group when the world is Gloo, else a
// Gloo world group of its own. Gloo groups on one node go through shared
// memory (shm_group.h); ones that span nodes sum hierarchically (hier_group.h).
// The pp group's send/recv go through shared memory too when its members
// share a node (shm_p2p.h).
// make_side_group (side_group.h) adds a Gloo world group on a pg of its own,
// after build, for another thread's use.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <thread>

#include "common/error.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/group_factory.h"
#include "engine/comm/hier_group.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/shm_group.h"
#include "engine/comm/shm_p2p.h"
#include "engine/comm/shm_segment.h"
#include "engine/comm/side_group.h"
#include "engine/comm/store_wait.h"
#include "engine/comm/traced_group.h"

namespace dtrain::engine::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

void Group::unsupported(const char* op) const {
  throw Error(ErrorCode::internal,
              "backend " + backend() + " lacks " + op + " (group " + name() + ")",
              "use a backend that has it (gloo or nccl), or build the op from ones it has");
}

WorkPtr Group::reduce_scatter(const at::Tensor&, at::Tensor&, bool) { unsupported("reduce_scatter"); }
WorkPtr Group::all_to_all(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&,
                          const std::vector<int64_t>&, bool) {
  unsupported("all_to_all");
}
WorkPtr Group::send(const at::Tensor&, int, int) { unsupported("send"); }
WorkPtr Group::recv(at::Tensor&, int, int) { unsupported("recv"); }

bool nccl_available() {
#ifdef DTRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Group& Comm::axis(const std::string& name) {
  mesh::GroupKind kind{};
  if (!mesh::parse_group(name, &kind))
    throw Error(ErrorCode::internal, "no process group named '" + name + "'",
                "groups are those of common/mesh.h's group_defs (tp, cp, dp, pp, dp_cp, ep, edp)");
  return group(kind);
}

namespace {

class CommImpl : public Comm {
 public:
  CommImpl(WorldInfo info, c10::intrusive_ptr<c10d::Store> store)
      : info_(std::move(info)), store_(std::move(store)) {}
  // NCCL's communicators are flushed and torn down here, as
  // torch.distributed.destroy_process_group does: ProcessGroupNCCL's
  // destructor would do the same, but first warns at every exit that it was
  // not called.
  ~CommImpl() override {
    for (auto& pg : nccl_pgs_) {
      try {
        pg->shutdown();
      } catch (...) {  // exiting: the destructor's own teardown still runs
      }
    }
  }

  const WorldInfo& info() const override { return info_; }
  Group& world() override { return *world_; }
  Group& group(mesh::GroupKind kind) override { return *axes_.at(mesh::group_name(kind)); }
  Group& control() override { return control_ ? *control_ : *world_; }

  void build(const CommOptions& options);
  std::unique_ptr<Group> side_group(const std::string& name) {
    return detail::make_group("gloo", name, all_, info_.rank,
                              detail::make_pg("gloo", "side/" + name, info_.rank, info_.world, ctx_), 0, ctx_);
  }

 private:
  // The pg over every rank in rank order for `backend`, made on first use:
  // groups with the world's members share it instead of connecting again.
  const c10::intrusive_ptr<c10d::Backend>& world_pg(const std::string& backend);
  c10::intrusive_ptr<c10d::Backend> make_pg(const std::string& backend, const std::string& key, int rank,
                                            int size);
  // Every Gloo group (world, axes) all-reduces through shared memory where
  // its members share a machine; set up collectively, in build's order.
  void add_shm_collectives(int64_t slot_bytes);
  // The pp group's send/recv between neighbours (the pipeline's messages)
  // through rings in shared memory where its members share a machine.
  void add_shm_p2p(int64_t slot_bytes);
  // Then every Gloo group left on Gloo (it spans nodes) that has several
  // members on a node all-reduces hierarchically; groups with the same
  // members share the node and leader groups.
  void add_hier_all_reduce(int64_t slot_bytes);
  detail::ShmOptions shm_options(int64_t slot_bytes) const;

  WorldInfo info_;
  c10::intrusive_ptr<c10d::Store> store_;  // outlives the groups below
  detail::GroupContext ctx_;
  std::vector<int> all_;  // 0..world-1
  std::map<std::string, c10::intrusive_ptr<c10d::Backend>> world_pgs_;  // by backend
  std::unique_ptr<Group> world_;
  std::unique_ptr<Group> control_;  // null when the world is Gloo: the world group serves
  std::map<std::string, std::unique_ptr<Group>> axes_;  // by group name, one per kind
  std::vector<c10::intrusive_ptr<c10d::Backend>> nccl_pgs_;  // shut down first, at destruction
};

c10::intrusive_ptr<c10d::Backend> CommImpl::make_pg(const std::string& backend, const std::string& key,
                                                    int rank, int size) {
  auto pg = detail::make_pg(backend, key, rank, size, ctx_);
  if (backend == "nccl" && pg) nccl_pgs_.push_back(pg);
  return pg;
}

const c10::intrusive_ptr<c10d::Backend>& CommImpl::world_pg(const std::string& backend) {
  auto it = world_pgs_.find(backend);
  if (it == world_pgs_.end())
    it = world_pgs_.emplace(backend, make_pg(backend, "world", info_.rank, info_.world))
             .first;
  return it->second;
}

detail::ShmOptions CommImpl::shm_options(int64_t slot_bytes) const {
  detail::ShmOptions so;
  so.slot_bytes = slot_bytes;
  so.node = info_.node_rank;
  so.timeout_s = ctx_.timeout_s;
  // More ranks here than cores: never spin, the core is a peer's.
  if (info_.local_world > static_cast<int>(std::thread::hardware_concurrency())) so.spin_us = 0;
  return so;
}

void CommImpl::add_hier_all_reduce(int64_t slot_bytes) {
  const detail::ShmOptions so = shm_options(slot_bytes);
  std::map<std::vector<int>, std::shared_ptr<detail::HierLinks>> links;  // by members
  auto wrap = [&](std::unique_ptr<Group>& g) {
    if (!g || g->backend() != "gloo" || g->path() != "gloo") return;  // shm: one node already
    auto [it, fresh] = links.try_emplace(g->global_ranks());
    if (fresh) {
      std::string key = "hier/";
      for (int r : g->global_ranks()) key += std::to_string(r) + ",";
      it->second = detail::make_hier_links(*g, ctx_, key + "/", so);
    }
    g = detail::with_hier_all_reduce(std::move(g), it->second);
  };
  wrap(world_);
  wrap(control_);
  for (auto& entry : axes_) wrap(entry.second);
}

void CommImpl::add_shm_collectives(int64_t slot_bytes) {
  const detail::ShmOptions so = shm_options(slot_bytes);
  auto wrap = [&](std::unique_ptr<Group>& g) {
    if (!g || g->backend() != "gloo") return;
    std::string key = "shm/" + g->name() + "/";  // one key per group: its name and members
    for (int r : g->global_ranks()) key += std::to_string(r) + ",";
    g = detail::with_shm_collectives(std::move(g), store_, key, so);
  };
  wrap(world_);
  wrap(control_);
  for (auto& entry : axes_) wrap(entry.second);
}

void CommImpl::add_shm_p2p(int64_t slot_bytes) {
  auto it = axes_.find("pp");
  if (it == axes_.end() || !it->second || it->second->backend() != "gloo") return;
  std::string key = "shm_p2p/pp/";
  for (int r : it->second->global_ranks()) key += std::to_string(r) + ",";
  // Each direction's ring holds what the collectives stage in flight per
  // rank (kSets x slot, 4 MiB by default): a [8, 64, 1024] fp32 activation
  // goes in whole, so a send rarely waits for its receiver.
  it->second = detail::with_shm_p2p(std::move(it->second), store_, key, shm_options(slot_bytes),
                                    detail::kSets * slot_bytes);
}

// Every rank walks every group of every kind in group_defs order and joins
// the one that holds it; other groups are not its business.
template <typename Visit>
void for_each_own_group(const WorldInfo& info, Visit visit) {
  for (const mesh::GroupDef& def : mesh::group_defs()) {
    auto groups = mesh::groups(info.mesh, def.kind);
    for (size_t index = 0; index < groups.size(); ++index) {
      const auto& g = groups[index];
      auto pos = std::find(g.begin(), g.end(), info.rank);
      if (pos != g.end()) visit(def, index, g, static_cast<int>(pos - g.begin()));
    }
  }
}

// Order (the same on every rank, since groups connect collectively): the
// world on the data backend, then control (Gloo, unless the world is Gloo
// and serves), then the groups in group_defs order.
void CommImpl::build(const CommOptions& options) {
  // Under a launcher (a run dir): every op of every group goes into this
  // rank's collective trace, which the agent reads to attribute hangs. Made
  // before any group connects: a rank waiting here for a peer that never
  // started is seen alive (the rendezvous bounds start-up by it).
  std::shared_ptr<CollectiveTrace> trace;
  if (!info_.run_dir.empty()) {
    trace = CollectiveTrace::create(info_.run_dir, info_.rank);
    set_process_trace(trace);
  }
  ctx_.store = store_;
  ctx_.device = options.device;
  ctx_.timeout_s = options.timeout_s;
  ctx_.native_reduce_scatter = options.gloo_native_reduce_scatter;
  try {
    ctx_.gloo_device = detail::make_gloo_device(info_.master_addr, info_.gloo_socket_ifname);
  } catch (...) {
    detail::rethrow_comm_error("world", "creating the Gloo device");
  }
  all_.resize(info_.world);
  for (int i = 0; i < info_.world; ++i) all_[i] = i;
  world_ = detail::make_group(options.backend, "world", all_, info_.rank, world_pg(options.backend),
                              0, ctx_);
  if (options.backend != "gloo")
    control_ = detail::make_group("gloo", "control", all_, info_.rank, world_pg("gloo"), 0, ctx_);
  // Groups with the same members and backend share one pg (connections):
  // the world's for a group of every rank, and an earlier kind's for a kind
  // with the same members (dp_cp = dp when cp = 1; cp = dp_cp when dp = 1).
  // Each kind keeps its own Group (its name, its byte count) on a ring-tag
  // slot of its own. (Every rank sees the same mesh: all make the same choice.)
  struct Shared {
    c10::intrusive_ptr<c10d::Backend> pg;
    int next_slot = 0;
  };
  std::map<std::pair<std::vector<int>, std::string>, Shared> pgs;
  for (const std::string& backend : {options.backend, std::string("gloo")})
    if (world_pgs_.count(backend)) pgs[{all_, backend}] = {world_pgs_[backend], 1};  // slot 0: the world's own
  for_each_own_group(info_, [&](const mesh::GroupDef& def, size_t index, const std::vector<int>& g,
                                int rank) {
    const std::string axis = def.name;
    const std::string& backend = detail::backend_of(options, axis);
    auto [it, fresh] = pgs.try_emplace({g, backend});
    if (fresh && g == all_) it->second = {world_pg(backend), 1};
    else if (fresh) it->second.pg = make_pg(backend, axis + "/" + std::to_string(index), rank,
                                            static_cast<int>(g.size()));
    const int group_slot = it->second.next_slot++;
    axes_[axis] = detail::make_group(backend, axis, g, rank, it->second.pg, group_slot, ctx_);
  });
  if (options.shm) add_shm_collectives(options.shm_slot_bytes);
  if (options.shm) add_shm_p2p(options.shm_slot_bytes);
  if (options.shm && options.hierarchical) add_hier_all_reduce(options.shm_slot_bytes);
  if (!info_.run_dir.empty()) {
    world_ = traced(std::move(world_), trace);
    control_ = traced(std::move(control_), trace);
    for (auto& [axis, group] : axes_) group = traced(std::move(group), trace);
  }
}

}  // namespace

std::unique_ptr<Group> make_side_group(Comm& comm, const std::string& name) {
  auto* impl = dynamic_cast<CommImpl*>(&comm);
  if (impl == nullptr)
    throw Error(ErrorCode::internal, "make_side_group: the Comm was not made by init_comm",
                "make the Comm with init_comm or init_comm_with_store");
  return impl->side_group(name);
}

std::unique_ptr<Comm> init_comm_with_store(const WorldInfo& info,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const CommOptions& options) {
  // Every backend is checked before any group connects, so a bad one fails
  // on every rank alike instead of leaving peers waiting.
  detail::check_backend("cluster.backend", options.backend, options);
  for (const auto& [axis, backend] : options.axis_backend) {
    mesh::GroupKind kind{};
    if (!mesh::parse_group(axis, &kind))
      throw Error(ErrorCode::config,
                  "CommOptions.axis_backend names axis '" + axis + "' (backend " + backend +
                      "), which is not a mesh group",
                  "groups are tp, cp, dp, pp, dp_cp, ep and edp");
    detail::check_backend("axis " + axis, backend, options);
  }
  if (info.mesh.world() != info.world)
    throw Error(ErrorCode::internal, "mesh " + mesh::format_mesh(info.mesh) + " has " +
                                         std::to_string(info.mesh.world()) +
                                         " ranks, world is " + std::to_string(info.world));
  auto comm = std::make_unique<CommImpl>(info, store);
  comm->build(options);
  return comm;
}

std::unique_ptr<Comm> init_comm(const WorldInfo& info, const CommOptions& options) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.master_port);
  so.isServer = info.rank == 0;
  so.numWorkers = info.world;
  so.waitWorkers = false;  // the groups' own rendezvous waits for everyone
  const std::chrono::milliseconds full(static_cast<int64_t>(options.timeout_s * 1000));
  // A client's connect retries for the whole timeout with no socket that a
  // round abort (round_abort.h) could shut: a worker recovering in place
  // whose round ended while it waited for rank 0's store would wait there
  // for good. So it tries in slices of at most 1 s, and leaves between them
  // when the round is over.
  const auto deadline = std::chrono::steady_clock::now() + full;
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  for (;;) {
    // Not before rank 0's store listens: c10d's client, refused, would sleep
    // its backoff (0.25-0.75 s) before its next try (store_wait.h).
    if (!so.isServer)
      detail::wait_for_listener(info.master_addr, info.master_port,
                                std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1)));
    throw_if_round_aborted("connecting to the TCPStore");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    so.timeout = so.isServer ? full
                             : std::max(std::chrono::milliseconds(1), std::min(left, std::chrono::milliseconds(1000)));
    try {
      tcp = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
      break;
    } catch (const std::exception& e) {
      throw_if_round_aborted("connecting to the TCPStore");
      if (!so.isServer && std::chrono::steady_clock::now() < deadline) continue;
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      throw Error(ErrorCode::rendezvous,
                  "rank " + std::to_string(info.rank) + " cannot " + (so.isServer ? "serve" : "reach") +
                      " the TCPStore at " + info.master_addr + ":" + std::to_string(info.master_port) + ": " + what,
                  so.isServer ? "another process holds MASTER_PORT; pick a free port"
                              : "check MASTER_ADDR/MASTER_PORT and that rank 0 is running");
    }
  }
  tcp->setTimeout(full);  // the store's operations wait the whole timeout
  // A restarted round must not read the previous round's keys.
  auto store = c10::make_intrusive<c10d::PrefixStore>("r" + std::to_string(info.restart), tcp);
  return init_comm_with_store(info, store, options);
}

}  // namespace dtrain::engine::comm
