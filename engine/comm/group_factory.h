// The per-axis backend factory: a process group and its comm::Group for a
// backend named by string ("gloo" | "nccl"). The one place that names
// GlooGroup and NcclGroup. It does not decide which groups exist, who is in
// them or which connections they share: init_comm (comm.cpp) does.
// Internal to engine/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/gloo_backend.h"

namespace dtrain::engine::comm::detail {

// What every group of one Comm shares.
struct GroupContext {
  c10::intrusive_ptr<c10d::Store> store;  // each group under a PrefixStore of it
  GlooDevice gloo_device;                 // the process's Gloo transport
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // NCCL's GPU
  double timeout_s = 300;
  bool native_reduce_scatter = false;  // Gloo: Gloo's own reduce-scatter, not our ring
};

// The backend of `axis`'s groups: options.axis_backend[axis], else
// options.backend.
const std::string& backend_of(const CommOptions& options, const std::string& axis);

// Throws dtrain::Error(config) unless `backend` can run here: a known name
// (gloo, nccl), built in (nccl needs a LibTorch with CUDA) and given the
// tensors it needs (nccl: a CUDA options.device). `what` names the setting in
// the message and its fix ("cluster.backend", "axis tp").
void check_backend(const std::string& what, const std::string& backend, const CommOptions& options);

// A c10d process group of `backend` over `size` ranks (collective over
// them), under "pg/<key>" (Gloo) or "pg/<backend>/<key>" of ctx.store.
// nullptr for a Gloo group of one rank: it needs no connections (every op is
// a local copy). An NCCL group of one rank still gets one, so that a one-GPU
// machine runs through NCCL.
c10::intrusive_ptr<c10d::Backend> make_pg(const std::string& backend, const std::string& key,
                                          int rank, int size, const GroupContext& ctx);

// The Group `name` over `pg` (from make_pg, possibly shared by groups with
// the same members in the same order). `slot` (Gloo, 0..7) separates the
// ring tags of Gloo groups that share one pg.
std::unique_ptr<Group> make_group(const std::string& backend, const std::string& name,
                                  std::vector<int> members, int rank,
                                  c10::intrusive_ptr<c10d::Backend> pg, int slot,
                                  const GroupContext& ctx);

}  // namespace dtrain::engine::comm::detail
