// The segments behind symmetric_buffer.h: one region per member of a group
// that runs its collectives through shared memory (shm_group.h), and the
// in-place all_reduce of a range of it; and one region all members share.
// shm_group.cpp's ShmGroup makes them and sends an all_reduce of a tensor
// that lies in a symmetric one here. Internal to engine/comm.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/comm/shm_group.h"

namespace dtrain::engine::comm::detail {

class SymmetricSegment;

// A segment of `numel` zeroed elements of `dtype` per member of `g`, set up
// collectively over `store` under `key` (every member calls it with the same
// arguments). Null, with one log line from member 0 saying why, where dtype
// is not one the segments add (silently), where the segment would take over
// a quarter of /dev/shm, or where a member could not map it.
std::shared_ptr<SymmetricSegment> open_symmetric(const Group& g, c10d::Store& store, const std::string& key,
                                                 int64_t numel, at::ScalarType dtype, const ShmOptions& options);

// This member's region (numel elements).
char* symmetric_region(const SymmetricSegment& s);

// Elements of all_reduce sums on s this member has added up so far (its
// shares, or whole ranges it reduced as the last to arrive).
int64_t symmetric_summed_elements(const SymmetricSegment& s);

// Whether t (contiguous, CPU, non-empty, a dtype the segment adds) lies in
// this member's region.
bool symmetric_holds(const SymmetricSegment& s, const at::Tensor& t);

// The in-place all_reduce of t (which symmetric_holds): every member passes
// the same range, in the same order. A sum of fp32 or fp64 is shared (each
// member sums its 1/n of the range once all have arrived, at its arrival
// or a later op's, or at wait()); another op is the last arriver's. wait()
// throws dtrain::Error(internal) on every member where the ranges differ.
WorkPtr symmetric_all_reduce(const std::shared_ptr<SymmetricSegment>& s, const at::Tensor& t, ReduceOp op);

// reduce_scatter (sum) of in (which symmetric_holds; n blocks of
// out.numel()) into out: wait() reads this member's block of every member's
// input where it lies, in member order (the staged path's bits), then
// returns once every member has read its block (so none writes its input
// again before the others are done with it). Every member passes the same
// range, in the same order as its other ops on s; wait() throws
// dtrain::Error(internal) on every member where the ranges differ.
WorkPtr symmetric_reduce_scatter(const std::shared_ptr<SymmetricSegment>& s, const at::Tensor& in,
                                 const at::Tensor& out);

// The hierarchical all-reduce's node stages (hier_group.cpp) on t (which
// symmetric_holds, on every member of the node group that made s): the
// node leader (member 0) sums every member's range into its own in member
// order, calls across(its range) (the all-reduce over the nodes' leaders,
// only there), and copies the result into the others' ranges; nothing is
// staged or copied out. Blocks until then on every member. Throws
// dtrain::Error where the ranges differ (internal) or across threw (the
// leader rethrows its error, the others say so).
void symmetric_hier_all_reduce(SymmetricSegment& s, const at::Tensor& t,
                               const std::function<void(at::Tensor&)>& across);

// The symmetric segment of g (a group with_shm_collectives gave shared
// memory) whose region holds t, or null.
std::shared_ptr<SymmetricSegment> symmetric_holding(Group& g, const at::Tensor& t);

// shared_buffer's region (symmetric_buffer.h): `numel` zeroed elements of
// `dtype` in one segment every member of `g` maps, set up collectively over
// `store` under `key`. Undefined, with one log line from member 0 saying
// why, where it would take over a quarter of /dev/shm or a member could not
// map it. The tensor keeps the mapping alive.
at::Tensor open_shared_region(const Group& g, c10d::Store& store, const std::string& key, int64_t numel,
                              at::ScalarType dtype, const ShmOptions& options);

}  // namespace dtrain::engine::comm::detail
