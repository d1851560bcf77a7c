// ZeRO's per-rank state (internal to engine/parallel/zero): the units' flat
// buffers and the collectives on them, ZeRO-3's gathers (or, with shared
// parameters, its barriers) and every stage's gradient launch. zero_sync.cpp
// builds it and drives it from the model's hooks and the trainer's calls.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/parallel/bucket_hooks.h"
#include "engine/parallel/param_layout.h"
#include "engine/parallel/zero/flat_layout.h"
#include "engine/parallel/zero/param_offload.h"
#include "engine/parallel/zero/zero_sync.h"
#include "plan/memory_plan.h"

namespace dtrain::engine::parallel::zero {

struct Unit {
  at::Tensor full;         // [padded]: the unit's parameters are views of it
  at::Tensor param_shard;  // [S]: what this rank's optimizer updates
  at::Tensor grad_full;    // ZeRO-1 [padded]: the parameters' grads are views of it
  at::Tensor grad_shard;   // [S]: the reduced gradient of this rank's shard
  bool gathered = true;    // `full` holds the current parameters
  comm::WorkPtr gather;    // ZeRO-3: all-gather into `full` in flight
  comm::WorkPtr reduce;    // gradient all-reduce / reduce-scatter in flight
  at::Tensor reduce_in, reduce_out;  // ZeRO-2/3: its buffers ([padded], [S])
  // ZeRO-2/3: the next reduce_in, made when the unit's backward computes its
  // first weight gradient straight into it (grad_slot.h); taken by launch.
  at::Tensor pending;
  // ZeRO-2/3 after zero(): grad_shard still holds the last step's sum, and
  // the step's first reduce-scatter writes straight into it (no zero fill,
  // no separate output, no add); later ones (ZeRO-3 micro-steps) add.
  bool shard_stale = false;
};

struct ZeroState {
  ZeroOptions options;
  comm::Group* dp = nullptr;
  comm::Group* tp = nullptr;
  comm::Group* pp = nullptr;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<ParamLayout> layouts;
  std::vector<int> unit_of;
  FlatLayout layout;
  std::vector<Unit> units;
  // One allocation each; the units' tensors are views of them.
  at::Tensor full_all, grad_all, param_shards_all, grad_shards_all;
  // Units launch in backward order: the last unit's gradients complete first.
  BucketHooks hooks;
  double exposed_gather_s = 0;  // ZeRO-3: time spent waiting for gathers this step
  // A tied head (model.tie_embeddings) reads unit 0's wte: ZeRO-3 keeps
  // unit 0 gathered from the embedding's forward until its gradients are
  // reduced (FSDP keeps shared parameters in the unit that runs first).
  bool tied = false;
  // train.offload.params: a unit's shard is read back before its gather
  // (the unit after it queued behind) and leaves memory once gathered.
  std::unique_ptr<ParamOffload> offload;
  // ZeRO-3, parallel.fsdp.shared_params on one machine: full_all is the dp
  // group's shared buffer; the units are always "gathered". `sync_due`: a
  // shard may have changed since the ranks last met (set by the optimizer
  // step and at start, before any checkpoint load), so the next gather is a
  // meet(), once.
  bool shared = false;
  bool sync_due = false;
  at::Tensor token;  // [1]: meet()'s all-reduce
  int64_t shard_numel = 0;  // the sum of this rank's shards (memory())
  // ZeRO-2/3 where the dp group runs through shared memory: the units'
  // reduce-scatter inputs are taken from kInputPool buffers of its
  // symmetric buffer (symmetric_buffer.h: every rank's input is read where
  // it lies, nothing is staged), one per unit from its backward's first
  // claim until its reduce-scatter is read by every rank. Empty elsewhere
  // (each input is a tensor of its own).
  static constexpr int kInputPool = plan::kZeroInputPool;  // what `dtrain plan` counts
  std::vector<at::Tensor> input_pool;  // [largest padded] each
  std::vector<int> pool_user;          // per pool buffer: the unit holding it, or -1
  std::vector<int> pool_of;            // per unit: the pool buffer it holds, or -1
  std::vector<uint64_t> launched_at;   // per unit: when its reduce-scatter started (launch order)
  uint64_t launches = 0;

  int stage() const { return options.stage; }
  // A barrier of the dp group through its own collectives (shared memory:
  // a futex wake, where Gloo's barrier is a TCP round trip via its threads),
  // in order with the reduce-scatters.
  void meet();
  int64_t shard_begin(const FlatUnit& u) const { return layout.rank * u.shard; }

  // ---- ZeRO-3 gathers ----
  // `next`: the unit expected after u (forward: u + 1, backward: u - 1),
  // whose shard an offload reads meanwhile. Shared parameters: nothing to
  // gather; the first ensure_gathered after a step meets the other ranks.
  void start_gather(int u, int next = -1);
  void ensure_gathered(int u, int next = -1);
  void release(int u);

  // ---- gradients ----
  // Unit u's next reduce-scatter input, [padded], uninitialised: a pool
  // buffer where there is one (the free one, else the one whose unit's
  // reduce-scatter started first, once every rank has read it; the same
  // choice on every rank), else a tensor of its own.
  at::Tensor pending_input(int u);
  // Where backward computes parameter i's first gradient (grad_slot.h's
  // make; called under its lock): its place in unit u's pending input,
  // made on the unit's first claim.
  at::Tensor grad_slot(int u, int64_t offset, int i);
  // Unit u's gradients complete: its all-reduce (ZeRO-1) or reduce-scatter
  // (ZeRO-2/3) starts; ZeRO-3 then releases the unit.
  void launch(int u);
  void wait_reduce(int u);
};

}  // namespace dtrain::engine::parallel::zero
