// init_comm: the TCPStore (rank 0 serves it at MASTER_ADDR:MASTER_PORT) and
// the process groups: the world plus one group per mesh axis from
// common/mesh.h, each over its own PrefixStore, on the data backend; and the
// control group (Gloo, world). With Gloo: one Gloo device for all groups, an
// axis group of one rank needs no connections, one equal to the world shares
// the world's, and control is the world group. With NCCL: every group is an
// NCCL group under "pg/nccl/..." (communicators are made at the first op),
// and control is a Gloo world group of its own.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "common/error.h"
#include "engine/comm/gloo_backend.h"
#include "engine/comm/gloo_group.h"
#ifdef DTRAIN_WITH_CUDA
#include "engine/comm/nccl_group.h"
#endif

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

namespace {

using detail::GlooGroup;

const char* const kAxes[] = {"dp", "tp", "pp", "ep", "edp"};

class CommImpl : public Comm {
 public:
  CommImpl(WorldInfo info, c10::intrusive_ptr<c10d::Store> store)
      : info_(std::move(info)), store_(std::move(store)) {}

  const WorldInfo& info() const override { return info_; }
  Group& world() override { return *world_; }
  Group& axis(const std::string& axis) override {
    auto it = axes_.find(axis);
    if (it == axes_.end())
      throw Error(ErrorCode::internal, "no process group for axis '" + axis + "'",
                  "axes are dp, tp, pp, ep and edp");
    return *it->second;
  }
  Group& control() override { return control_ ? *control_ : *world_; }

  void build(const CommOptions& options);

 private:
  c10::intrusive_ptr<c10d::Backend> make_gloo_pg(const std::string& prefix, int rank, int size,
                                                 const CommOptions& options);
  void build_nccl(const CommOptions& options);

  WorldInfo info_;
  c10::intrusive_ptr<c10d::Store> store_;  // outlives the groups below
  detail::GlooDevice device_;
  std::unique_ptr<Group> world_;
  std::unique_ptr<Group> control_;  // null with Gloo: the world group serves
  std::map<std::string, std::unique_ptr<Group>> axes_;
};

c10::intrusive_ptr<c10d::Backend> CommImpl::make_gloo_pg(const std::string& prefix, int rank,
                                                        int size, const CommOptions& options) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  try {
    // two async ops in flight per group (DDP buckets)
    return detail::make_gloo_backend(store, rank, size, options.timeout_s, /*threads=*/2, device_);
  } catch (...) {
    detail::rethrow_comm_error(prefix, "creating the process group");
  }
}

// Every rank walks every group of every axis in the same order and joins
// the one that holds it; other groups are not its business.
template <typename Visit>
void for_each_own_group(const WorldInfo& info, Visit visit) {
  for (const char* axis : kAxes) {
    auto groups = mesh::axis_groups(info.shape, axis);
    for (size_t index = 0; index < groups.size(); ++index) {
      const auto& g = groups[index];
      auto pos = std::find(g.begin(), g.end(), info.rank);
      if (pos != g.end()) visit(std::string(axis), index, g, static_cast<int>(pos - g.begin()));
    }
  }
}

void CommImpl::build(const CommOptions& options) {
  try {
    device_ = detail::make_gloo_device(info_.master_addr, info_.gloo_socket_ifname);
  } catch (...) {
    detail::rethrow_comm_error("world", "creating the Gloo device");
  }
  std::vector<int> all(info_.world);
  for (int i = 0; i < info_.world; ++i) all[i] = i;
  const bool native_rs = info_.gloo_reduce_scatter == "native";
  if (options.backend == "nccl") {
    if (info_.world > 1)
      control_ = std::make_unique<GlooGroup>(
          "control", all, info_.rank, make_gloo_pg("pg/control", info_.rank, info_.world, options), 0,
          native_rs);
    else
      control_ = std::make_unique<GlooGroup>("control", all, info_.rank, nullptr, 0, native_rs);
    build_nccl(options);
    return;
  }
  c10::intrusive_ptr<c10d::Backend> world_pg;
  if (info_.world > 1) world_pg = make_gloo_pg("pg/world", info_.rank, info_.world, options);
  world_ = std::make_unique<GlooGroup>("world", all, info_.rank, world_pg, 0, native_rs);
  int slot = 1;
  for_each_own_group(info_, [&](const std::string& axis, size_t index, const std::vector<int>& g,
                                int rank) {
    c10::intrusive_ptr<c10d::Backend> pg;
    int group_slot = 0;
    if (g.size() == all.size()) {
      pg = world_pg;  // same members, same order: reuse the world's connections
      group_slot = slot++;
    } else if (g.size() > 1) {
      pg = make_gloo_pg("pg/" + axis + "/" + std::to_string(index), rank, static_cast<int>(g.size()),
                        options);
    }
    axes_[axis] = std::make_unique<GlooGroup>(axis, g, rank, pg, group_slot, native_rs);
  });
}

void CommImpl::build_nccl(const CommOptions& options) {
#ifdef DTRAIN_WITH_CUDA
  auto make = [&](const std::string& prefix, int rank, int size) {
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    try {
      return detail::make_nccl_backend(store, rank, size, options.timeout_s);
    } catch (...) {
      detail::rethrow_comm_error(prefix, "creating the NCCL process group");
    }
  };
  std::vector<int> all(info_.world);
  for (int i = 0; i < info_.world; ++i) all[i] = i;
  auto world_pg = make("pg/nccl/world", info_.rank, info_.world);
  world_ = std::make_unique<detail::NcclGroup>("world", all, info_.rank, world_pg, options.device);
  for_each_own_group(info_, [&](const std::string& axis, size_t index, const std::vector<int>& g,
                                int rank) {
    auto pg = g.size() == all.size()
                  ? world_pg
                  : make("pg/nccl/" + axis + "/" + std::to_string(index), rank,
                         static_cast<int>(g.size()));
    axes_[axis] = std::make_unique<detail::NcclGroup>(axis, g, rank, pg, options.device);
  });
#else
  (void)options;
#endif
}

}  // namespace

std::unique_ptr<Comm> init_comm_with_store(const WorldInfo& info,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const CommOptions& options) {
  if (options.backend != "gloo" && options.backend != "nccl")
    throw Error(ErrorCode::config, "comm backend '" + options.backend + "' is unknown",
                "use cluster.backend gloo or nccl");
  if (options.backend == "nccl" && !nccl_available())
    throw Error(ErrorCode::config, "cluster.backend = nccl, but this dtrain was built on a LibTorch "
                                   "without CUDA, so it has no NCCL",
                "use cluster.backend gloo, or build against PyTorch with CUDA (scripts/install-deps)");
  if (options.backend == "nccl" && options.device.is_cpu())
    throw Error(ErrorCode::config, "cluster.backend = nccl needs CUDA tensors, the device is cpu",
                "use cluster.device cuda, or backend gloo");
  if (info.shape.world() != info.world)
    throw Error(ErrorCode::internal, "mesh " + mesh::format_shape(info.shape) + " has " +
                                         std::to_string(info.shape.world()) +
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
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw Error(ErrorCode::rendezvous,
                "rank " + std::to_string(info.rank) + " cannot " +
                    (so.isServer ? "serve" : "reach") + " the TCPStore at " + info.master_addr +
                    ":" + std::to_string(info.master_port) + ": " + what,
                so.isServer ? "another process holds MASTER_PORT; pick a free port"
                            : "check MASTER_ADDR/MASTER_PORT and that rank 0 is running");
  }
  // A restarted round must not read the previous round's keys.
  auto store = c10::make_intrusive<c10d::PrefixStore>("r" + std::to_string(info.restart), tcp);
  return init_comm_with_store(info, store, options);
}

}  // namespace dtrain::engine::comm
