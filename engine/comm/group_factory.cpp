// The per-axis backend factory (group_factory.h): backend names to process
// groups. Gloo always; NCCL only in CUDA builds (DTRAIN_WITH_CUDA), where
// nccl_group.cpp is compiled. A new backend is one more branch in each
// function here and one more name in check_backend.
#include "engine/comm/group_factory.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error.h"
#include "engine/comm/gloo_group.h"
#ifdef DTRAIN_WITH_CUDA
#include "engine/comm/nccl_group.h"
#endif

namespace dtrain::engine::comm::detail {

const std::string& backend_of(const CommOptions& options, const std::string& axis) {
  auto it = options.axis_backend.find(axis);
  return it == options.axis_backend.end() ? options.backend : it->second;
}

void check_backend(const std::string& what, const std::string& backend, const CommOptions& options) {
  // "cluster.backend" is a spec field; an axis is chosen in code, so its fix
  // names the axis rather than a field.
  const bool axis = what.rfind("axis ", 0) == 0;
  const std::string gloo_instead = axis ? "gloo for " + what : "cluster.backend gloo";
  if (backend != "gloo" && backend != "nccl")
    throw Error(ErrorCode::config, what + ": comm backend '" + backend + "' is unknown",
                axis ? "use gloo or nccl for " + what : "use cluster.backend gloo or nccl");
  if (backend == "nccl" && !nccl_available())
    throw Error(ErrorCode::config,
                what + " = nccl, but this dtrain was built on a LibTorch without CUDA, so it "
                       "has no NCCL",
                "use " + gloo_instead + ", or build against PyTorch with CUDA (scripts/install-deps)");
  if (backend == "nccl" && options.device.is_cpu())
    throw Error(ErrorCode::config, what + " = nccl needs CUDA tensors, the device is cpu",
                "use cluster.device cuda, or " + gloo_instead);
}

c10::intrusive_ptr<c10d::Backend> make_pg(const std::string& backend, const std::string& key,
                                          int rank, int size, const GroupContext& ctx) {
  if (backend == "gloo") {
    if (size == 1) return nullptr;
    const std::string prefix = "pg/" + key;
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, ctx.store);
    try {
      // two async ops in flight per group (DDP buckets)
      return make_gloo_backend(store, rank, size, ctx.timeout_s, /*threads=*/2, ctx.gloo_device);
    } catch (...) {
      rethrow_comm_error(prefix, "creating the process group");
    }
  }
#ifdef DTRAIN_WITH_CUDA
  if (backend == "nccl") {
    const std::string prefix = "pg/nccl/" + key;
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, ctx.store);
    try {
      return make_nccl_backend(store, rank, size, ctx.timeout_s);
    } catch (...) {
      rethrow_comm_error(prefix, "creating the NCCL process group");
    }
  }
#endif
  throw Error(ErrorCode::internal, "no process group for backend '" + backend + "' (group " + key + ")",
              "init_comm checks every backend with check_backend before making groups");
}

std::unique_ptr<Group> make_group(const std::string& backend, const std::string& name,
                                  std::vector<int> members, int rank,
                                  c10::intrusive_ptr<c10d::Backend> pg, int slot,
                                  const GroupContext& ctx) {
  if (backend == "gloo")
    return std::make_unique<GlooGroup>(name, std::move(members), rank, std::move(pg), slot,
                                       ctx.native_reduce_scatter);
#ifdef DTRAIN_WITH_CUDA
  if (backend == "nccl")
    return std::make_unique<NcclGroup>(name, std::move(members), rank, std::move(pg), ctx.device);
#endif
  throw Error(ErrorCode::internal, "no group for backend '" + backend + "' (group " + name + ")",
              "init_comm checks every backend with check_backend before making groups");
}

}  // namespace dtrain::engine::comm::detail
