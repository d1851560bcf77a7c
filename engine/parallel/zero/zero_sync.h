// ZeRO-1/2/3 (docs/ARCHITECTURE.md, 'Data parallelism: DDP and ZeRO-1/2/3') behind
// GradSync, over the flat padded shards of flat_layout.h, one flat buffer per model unit:
//   ZeRO-1: AdamW moments sharded; gradients all-reduced per unit from the
//           backward hooks (overlapped), each rank updates its shard, the
//           updated shards are all-gathered into the parameters.
//   ZeRO-2: gradients reduce-scattered per unit while backward runs; a rank
//           keeps only its gradient shard.
//   ZeRO-3: parameters sharded too (FSDP full shard): a unit is all-gathered
//           before its forward and its backward and freed after each; its
//           gradients are reduce-scattered every micro-step and accumulated
//           into the shard; the next unit's gather is prefetched.
// The checkpoint view writes each rank's shards as slices of the named
// tensors, so a ZeRO checkpoint loads under any layout and dp.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/model/gpt.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/param_layout.h"

namespace dtrain::engine::parallel {

struct ZeroOptions {
  int stage = 1;                      // 1, 2 or 3
  bool reshard_after_forward = true;  // ZeRO-3: free a unit after its forward (false: keep until backward)
  bool prefetch = true;               // ZeRO-3: gather the next unit while this one computes
  // ZeRO-3 with dp on one machine (its collectives through shared memory, on
  // the CPU): the units' flat buffers in one segment all ranks map, each
  // rank's shard its own range; no gathers (the two options above unused).
  bool shared_params = true;
  // ZeRO-3, train.offload.params nvme: every unit's shard lives in this file
  // between uses (zero/param_offload.h), on a CPU or a GPU; "" = in memory.
  std::string offload_file;
  bool offload_host = false;  // train.offload.params host: in a host buffer instead (CPU: the test override)
  bool offload_params() const { return offload_host || !offload_file.empty(); }
  bool offload_prefetch = true;      // read the next unit's shard while this one is used
  bool offload_drop_writes = false;  // fault.kind offload_no_writeback: updates never written back
};

// named_params: the model's parameters in registration order (fp32,
// contiguous, on dp.device()), all initialised identically on every rank;
// layouts[i]: where parameter i sits in the global model (tensor
// parallelism; its norms add up over `tp`, and over `pp`, whose stages hold
// disjoint parameters); unit_of[i]: its unit, numbered densely
// (model->unit_of; ZeRO-3 needs every unit, i.e. pp = 1). ZeRO-3 installs
// its gather/free hooks on `model`, which must outlive the result.
// `dp`: where the gradients are summed (all-reduce / reduce-scatter) and the
// parameter shards all-gathered; its squared norms add up over it too.
std::unique_ptr<GradSync> make_zero_sync(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                         std::vector<ParamLayout> layouts, std::vector<int> unit_of,
                                         model::GptImpl& model, comm::Group& dp, comm::Group& tp,
                                         comm::Group& pp, ZeroOptions options);

}  // namespace dtrain::engine::parallel
