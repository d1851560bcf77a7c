// The memory planner: what each rank of a job spec will hold before it
// runs. Parameter, gradient and AdamW bytes exactly as the engine lays them
// out (the tensors of gpt_params.h, tensor-parallel slices, pipeline stages,
// ZeRO's padded flat units), activation bytes per micro-batch from the
// tensors autograd saves in the GPT or the llama (Korthikanti et al. 2022, adapted:
// recompute, sequence parallelism, tiled attention, dropout masks) times the
// micro-batches the pipeline schedule keeps in flight (pipeline_plan.h),
// backward's largest temporaries, MoE experts, the dataset's host copy; and
// FLOPs per step (flops.h). `dtrain plan` and the trainer's
// predicted-vs-measured check share it. Communication: traffic.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// ZeRO-2/3's reduce-scatter inputs where the shard group has shared memory:
// this many buffers of the largest padded unit each, in the group's
// symmetric buffer (engine/parallel/zero/zero_state.h's kInputPool is
// defined as this).
inline constexpr int kZeroInputPool = 3;

struct RankMemory {
  int rank = 0;
  int dp = 0, tp = 0, pp = 0, cp = 0;  // coordinates (common/mesh.h)
  int64_t param_bytes = 0;      // as GradSync::memory() reports them
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;  // AdamW's two moments (allocated in step 1); offloaded: the staging buckets
  int64_t offload_bytes = 0;    // state in host memory or nvme files: AdamW's moments, ZeRO-3's parameter shards (train.offload)
  int64_t cache_bytes = 0;      // other tensors kept across steps (the naive attention's causal masks)
  int64_t activation_bytes = 0; // saved for backward, all micro-batches in flight at once
  int64_t transient_bytes = 0;  // the largest temporaries on top (backward's; ZeRO's gathered units, gradient inputs)
  int64_t peak_bytes = 0;       // static + cache + activation + transient (a steady step's peak)
  int in_flight = 1;            // micro-batches (x chunks) whose activations are alive at once
  int64_t build_bytes = 0;      // the parameters this rank builds (its stage, tp slices, experts) before ZeRO shards them
  int64_t data_bytes = 0;       // the dataset's host copy (format bytes: about twice the file)
  int64_t static_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
  // What the rank's process needs at least: its tensor peak (or the build,
  // when larger) plus the data outside the allocator.
  int64_t need_bytes() const { return std::max(peak_bytes, build_bytes) + data_bytes; }
};

struct MemoryPlan {
  std::vector<RankMemory> ranks;  // by global rank
  double flops_per_step = 0;      // whole job, forward + backward (+ recompute), 2 per multiply-add
  int64_t max_peak_bytes() const;
  int64_t max_need_bytes() const;
};

// Every rank of the spec's mesh. Throws dtrain::Error(config) for a spec the
// engine would refuse (e.g. layers not divisible into pipeline stages).
MemoryPlan plan_memory(const JobSpec& spec);

// One rank's figures (what a worker compares with its own measurements).
RankMemory plan_rank(const JobSpec& spec, int rank);

// 1234567 -> "1.18 MiB".
std::string format_bytes(double bytes);

// The table `dtrain plan` prints (one line per rank) and its JSON form.
std::string plan_to_text(const JobSpec& spec, const MemoryPlan& plan);

}  // namespace dtrain::plan
