// The byte rings behind shm_p2p.h: one per direction between ring
// neighbours of a group in a /dev/shm segment its members share, the
// matching of records to receives (Gloo's: by peer and tag, in order), and
// the waits (futex, timeout, the round's abort flag). Knows nothing of
// Group decorators. Internal to engine/comm.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/comm/shm_group.h"

namespace dtrain::engine::comm::detail {

struct P2pOp;  // one posted send or receive (shm_rings.cpp)
using OpPtr = std::shared_ptr<P2pOp>;

class ShmRings {
 public:
  virtual ~ShmRings() = default;
  // Whether `peer` (an index in the group) has rings with this rank.
  virtual bool has_ring(int peer) const = 0;
  // Post a send or receive of t's bytes (contiguous, CPU; t stays alive
  // until the op is through); both make what progress they can at once.
  virtual OpPtr post_send(const at::Tensor& t, int peer, int tag) = 0;
  virtual OpPtr post_recv(const at::Tensor& t, int peer, int tag) = 0;
  // Makes progress until `op` is through. Throws dtrain::Error: timeout
  // (options.timeout_s), worker_failed (the round was aborted), internal
  // (a receive whose message has another size). `what` and `peer` name it.
  virtual void wait(const OpPtr& op, const char* what, int peer) = 0;
};

// Collective over g's members (every one calls it, in the same order as its
// other set-ups): the segment under `key` of `store`, rings of ring_bytes
// (rounded down to 16). Null, with `why` set, on every member alike when
// they cannot share one (different nodes, no /dev/shm).
std::shared_ptr<ShmRings> open_shm_rings(const Group& g, c10d::Store& store, const std::string& key,
                                         const ShmOptions& options, int64_t ring_bytes, std::string& why);

}  // namespace dtrain::engine::comm::detail
