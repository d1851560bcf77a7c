// make_gloo_backend: c10d's Gloo backend behind the Gloo-free c10d::Backend
// interface. The only place that names ProcessGroupGloo (it compiles against
// gloo_shim/, since PyTorch's wheels ship no Gloo headers); everything else in
// engine/comm holds a c10d::Backend.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

namespace dtrain::engine::comm::detail {

// A Gloo transport device, opaque here; made once per process and shared by
// every Gloo group of it. On `ifname` when given (WorldInfo's
// GLOO_SOCKET_IFNAME, as in PyTorch); else loopback when master_addr is
// 127.x or localhost, else the host's default interface.
using GlooDevice = std::shared_ptr<void>;
GlooDevice make_gloo_device(const std::string& master_addr, const std::string& ifname);

// Connects `size` ranks through `store` (collective over them). `threads`
// Gloo worker threads = async ops in flight at once.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, double timeout_s,
                                                    int threads, const GlooDevice& device);

}  // namespace dtrain::engine::comm::detail
