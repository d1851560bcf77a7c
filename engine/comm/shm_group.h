// Collectives through shared memory for the members of a Gloo group that
// share one machine (NCCL's SHM transport and DeepSpeed's CPU shm all-reduce
// do the same): a Group decorator whose all_reduce (sum, max, min),
// all_gather and reduce_scatter (sum) on fp32, fp64, int32 and int64 (and
// broadcast, of any dtype; and a sum to the first member alone,
// shm_reduce_to_first) copy
// into a /dev/shm segment and reduce there, with no socket, no Gloo thread
// and no kernel copy: the call stages the tensor (async too: it waits only
// when every staging set is still being read), and wait() takes the result
// into the output. Every other op and dtype goes to the inner group unchanged. It does not decide which groups get it
// (init_comm does) and falls back to the inner group, on every member alike,
// where the members cannot map one segment (different machines).
// Internal to engine/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

struct ShmOptions {
  // Bytes each rank stages per chunk; larger tensors go in chunks of this.
  int64_t slot_bytes = int64_t{512} << 10;
  double timeout_s = 300;  // a peer that never arrives: dtrain::Error(timeout)
  // Spin this long before sleeping on the futex (0 when the machine has
  // fewer cores than ranks: a spinning rank would hold the core its peer needs).
  int spin_us = 20;
  // This rank's node (GROUP_RANK): members on different nodes never share
  // a segment, even where they could map one (test hosts in network
  // namespaces of one kernel are separate machines).
  int node = 0;
};

// `inner` with its collectives through a segment shared by its members, set up
// collectively over `store` under `key` (every member must call this, in
// the same order as its other groups). Returns `inner` itself (with a log
// line saying why) where the members cannot share a segment. Size-1 groups
// are returned unchanged.
std::unique_ptr<Group> with_shm_collectives(std::unique_ptr<Group> inner,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const std::string& key, const ShmOptions& options);

// Sum (in member order) of every member's t into member 0's t, the others'
// t unchanged, through the segment of `g` (a group with_shm_collectives
// gave shared memory; every member calls it, in the same order as the
// group's other collectives): no member copies a result out. False, with
// nothing done, where `g` has no segment or t is not a contiguous CPU
// tensor of a dtype the segment adds (the caller all-reduces instead).
bool shm_reduce_to_first(Group& g, at::Tensor& t);

}  // namespace dtrain::engine::comm::detail
