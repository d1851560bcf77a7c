// Symmetric memory for the ranks of a group that share a machine (PyTorch's
// SymmetricMemory, NCCL's registered user buffers, on CPU shared memory): a
// tensor in a /dev/shm segment that holds one such buffer per member, so the
// group's all_reduce of a part of it reduces in place, reading every member's
// copy where it lies: nothing is staged into a scratch segment, nothing is
// copied back out. DDP's gradient buckets live in one, and ZeRO-2/3's
// reduce-scatter inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm {

// `numel` zeroed elements of `dtype` (fp32, fp64, int32 or int64) in a
// segment shared by the members of `g`, where `g` (or a group it decorates,
// such as the trace's) runs its collectives through shared memory
// (shm_group.h). Collective: every member calls it with the same numel, in
// the same order as the group's other collectives (it sets the segment up
// over the store). From then on g.all_reduce of a contiguous range of the
// returned tensor (the same offset and length on every member) is done in
// place: once every member has arrived, each sums its 1/n of the range in
// member order into every member's range (a sum; for another op the last
// member to arrive reduces the whole range; the same bits as the staged
// path either way); g.reduce_scatter whose input is such a range
// reads every member's block where it lies (its wait() returns once every
// member has read, so the input may be written again after it). Where `g`
// is a hierarchical group across machines (hier_group.h) the buffer is one
// of this machine's members, and g.all_reduce of a range of it runs both
// of its shared-memory stages in place. The tensor keeps the mapping alive.
// Undefined (nothing set up) where `g` has no shared-memory path, where the segment
// (numel x members) would take over a quarter of /dev/shm, where
// DTRAIN_SYMMETRIC_BUFFERS=0 (a bench's A/B), or where any member could not
// map it: the caller allocates its own memory and the collectives stage as
// before.
at::Tensor symmetric_buffer(Group& g, int64_t numel, at::ScalarType dtype);

// `numel` zeroed elements of `dtype` in one segment that every member of
// `g` maps: the same bytes for all of them (ZeRO-3's parameters on one
// machine: each rank writes its shard where the others read it). Collective
// as symmetric_buffer, and undefined where that one is (except for
// DTRAIN_SYMMETRIC_BUFFERS). Nothing orders the members' accesses: the
// caller does, with the group's collectives (a barrier after writing).
at::Tensor shared_buffer(Group& g, int64_t numel, at::ScalarType dtype);

// Bytes of memory this process holds in those buffers now: its own region
// of every symmetric buffer alive, and its 1/members share of every shared
// buffer alive (the machine holds one copy). /dev/shm pages the counting
// allocator (engine/device/counting_allocator.h) does not see, which the
// step's measured peak adds (engine/trainer/metrics.h's MemoryStats).
int64_t shm_buffer_bytes();

}  // namespace dtrain::engine::comm
