// init_comm: the TCPStore (rank 0 serves it at MASTER_ADDR:MASTER_PORT), one
// Gloo device, and the process groups: the world plus one group per mesh
// axis from common/mesh.h, each over its own PrefixStore "pg/<axis>/<index>".
// An axis group of one rank needs no Gloo; one equal to the world shares it.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "common/error.h"
#include "engine/comm/gloo_backend.h"
#include "engine/comm/gloo_group.h"

namespace dtrain::engine::comm {

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

  void build(const CommOptions& options);

 private:
  c10::intrusive_ptr<c10d::Backend> make_pg(const std::string& prefix, int rank, int size,
                                                    const CommOptions& options);

  WorldInfo info_;
  c10::intrusive_ptr<c10d::Store> store_;  // outlives the groups below
  detail::GlooDevice device_;
  std::unique_ptr<GlooGroup> world_;
  std::map<std::string, std::unique_ptr<GlooGroup>> axes_;
};

c10::intrusive_ptr<c10d::Backend> CommImpl::make_pg(const std::string& prefix, int rank, int size,
                                                   const CommOptions& options) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  try {
    // two async ops in flight per group (DDP buckets)
    return detail::make_gloo_backend(store, rank, size, options.timeout_s, /*threads=*/2, device_);
  } catch (...) {
    detail::rethrow_comm_error(prefix, "creating the process group");
  }
}

void CommImpl::build(const CommOptions& options) {
  try {
    device_ = detail::make_gloo_device(info_.master_addr);
  } catch (...) {
    detail::rethrow_comm_error("world", "creating the Gloo device");
  }
  std::vector<int> all(info_.world);
  for (int i = 0; i < info_.world; ++i) all[i] = i;
  c10::intrusive_ptr<c10d::Backend> world_pg;
  if (info_.world > 1) world_pg = make_pg("pg/world", info_.rank, info_.world, options);
  world_ = std::make_unique<GlooGroup>("world", all, info_.rank, world_pg, 0);

  // Every rank walks every group of every axis in the same order and joins
  // the one that holds it; other groups are not its business.
  int slot = 1;
  for (const char* axis : kAxes) {
    auto groups = mesh::axis_groups(info_.shape, axis);
    for (size_t index = 0; index < groups.size(); ++index) {
      const auto& g = groups[index];
      auto pos = std::find(g.begin(), g.end(), info_.rank);
      if (pos == g.end()) continue;
      int rank = static_cast<int>(pos - g.begin());
      c10::intrusive_ptr<c10d::Backend> pg;
      int group_slot = 0;
      if (g.size() == all.size()) {
        pg = world_pg;  // same members, same order: reuse the world's connections
        group_slot = slot++;
      } else if (g.size() > 1) {
        pg = make_pg("pg/" + std::string(axis) + "/" + std::to_string(index), rank,
                     static_cast<int>(g.size()), options);
      }
      axes_[axis] = std::make_unique<GlooGroup>(axis, g, rank, pg, group_slot);
    }
  }
}

}  // namespace

std::unique_ptr<Comm> init_comm_with_store(const WorldInfo& info,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const CommOptions& options) {
  if (options.backend != "gloo")
    throw Error(ErrorCode::config, "comm backend '" + options.backend + "' is not available",
                "this build has Gloo only (CPU); use cluster.backend gloo or a CUDA build for nccl");
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
