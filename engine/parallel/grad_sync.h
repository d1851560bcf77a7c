// The interfaces between a parallelism and the trainer (docs/ARCHITECTURE.md,
// 'The parallelize seam'): GradSync (a step's gradient communication, clipping
// over the right groups, what the optimizer updates) and StateProvider (what a
// checkpoint holds and who owns it). A parallelism implements them; the trainer
// and the checkpoint code use only these, never a parallelism's own type.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::engine::optim {
class AdamW;
class OffloadFile;
}

namespace dtrain::engine::parallel {

// What one step's gradient communication cost (metrics, overlap benchmark).
struct SyncStats {
  double wait_s = 0;             // time finish() spent launching + waiting (exposed comm)
  int launched_in_backward = 0;  // buckets whose communication started from a hook
  int buckets = 0;
};

// The tensors this rank's optimizer updates (full parameters for DDP, flat
// shards for ZeRO), with their gradients in .grad() after finish().
struct OptimizerParams {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<bool> decay;  // weight decay on matrices only (nanoGPT's choice)
  std::vector<at::Tensor> grads;  // each param's gradient; empty = params[i].grad()
  // Parameters whose storage is away between uses (train.offload.params):
  // the optimizer calls page(page_group[i], true) before updating params[i]
  // and page(.., false) after the group's last (optim::ParamPager). Empty: none.
  std::vector<int> page_group;
  std::function<void(int group, bool in)> page;
};

// Persistent bytes this rank holds for the model (metrics.jsonl).
struct ModelBytes {
  int64_t params = 0;  // train.offload.params: the most in memory this step
  int64_t grads = 0;
  int64_t offloaded = 0;  // train.offload.params: the parameter bytes in a file
};

// One tensor of a checkpoint: its stable name, the global shape, the slice
// of it this rank holds ({begin, end} per dim) and the local tensor (shaped
// like the slice). A rank holding several slices of one tensor (a flat ZeRO
// shard cut into rectangles) gives each its own `key` in its file.
struct StateEntry {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<std::pair<int64_t, int64_t>> slice;
  at::Tensor tensor;
  std::string key;  // the tensor's key in this rank's file; empty = name
};

class StateProvider {
 public:
  virtual ~StateProvider() = default;
  // What this rank writes (each global element written by exactly one rank).
  virtual std::vector<StateEntry> save_entries() = 0;
  // Where this rank reads into on resume (every element it holds).
  virtual std::vector<StateEntry> load_entries() = 0;
  // Whether save_entries' tensors keep their values and memory through the
  // next step's forward and backward (only its gradient sync's finish and the
  // optimizer change them): a checkpoint may then copy them while that step runs.
  virtual bool stable_until_optimizer() const { return false; }
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Before micro-step `micro` of a step; `last` = the step's final one (no
  // communication before it: PyTorch's no_sync).
  virtual void begin_micro(int micro, bool last) = 0;
  // After the last backward: every gradient communication of the step done.
  virtual SyncStats finish() = 0;
  // Clips by the global gradient norm, reducing partial norms over the right
  // groups and counting a replicated gradient once. Returns the norm before
  // clipping. The gradients are left as they are: `scale` gets the clip
  // factor, min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0), which
  // the optimizer applies as it reads them (optim::AdamW::step's grad_scale).
  virtual double clip(double max_norm, double& scale) = 0;
  virtual OptimizerParams optimizer_params() = 0;
  // After the optimizer step: bring the updated values to where the
  // forward reads them (ZeRO-1/2 all-gather the shards; DDP updated the
  // parameters themselves; ZeRO-3 gathers before each unit's forward).
  virtual void after_optimizer_step() {}
  virtual void zero() = 0;  // zero the gradients (storage kept)
  virtual ModelBytes memory() const = 0;
  // The checkpoint's view of model and optimizer state under this layout.
  virtual std::unique_ptr<StateProvider> state(optim::AdamW& optimizer) = 0;
  virtual std::string describe() const = 0;  // one line for the start-up log
  // Figures of the last step for metrics.jsonl beyond the loss (name, value),
  // the same on every rank: e.g. the experts' load under MoE. Default: none.
  virtual std::vector<std::pair<std::string, double>> step_metrics() const { return {}; }
  // train.offload.params: the file the parameters live in between uses
  // (under ZeRO-3: zero/param_offload.h); null without.
  virtual optim::OffloadFile* offloaded_params() { return nullptr; }
};

}  // namespace dtrain::engine::parallel
