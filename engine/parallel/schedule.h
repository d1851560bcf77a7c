// Schedule (docs/ARCHITECTURE.md, 'The parallelize seam'): runs one step's micro-batches
// over the model parts this rank holds and returns the local loss sum. NoPipeline is the
// plain micro-step loop; the pipeline schedules (pipeline/pipeline_schedule.h) implement
// the same interface. Knows nothing of data files or optimizers.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/parallel/grad_sync.h"
#include "engine/parallel/parallelize.h"

namespace dtrain::engine::parallel {

// Where micro-batches come from: fills [B, T] int64 token tensors on the
// model's device for micro-step `micro` of the current step.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void micro_batch(int micro, at::Tensor& inputs, at::Tensor& targets) = 0;
  // The step's global batch size in samples, and the global row of micro-batch `micro`'s
  // first sample (dropout masks: docs/ARCHITECTURE.md, 'Layout-invariant randomness').
  virtual int64_t global_rows() const = 0;
  virtual int64_t row_begin(int micro) const = 0;
};

struct StepOptions {
  int grad_accum = 1;
  // Each micro-batch mean loss is multiplied by this before backward (its
  // share of the global batch: docs/ARCHITECTURE.md, 'The parity recipe').
  double loss_scale = 1.0;
  bool bf16 = false;  // autocast the forward to bf16
  uint64_t seed = 0;  // job.seed, and the 0-based optimizer step: dropout streams
  int64_t step = 0;
};

// One evaluation pass (forward only; the caller turns autograd and dropout
// off): micro-batch m of the BatchSource holds rows[m] counted rows first,
// then rows that only fill it to the fixed micro-batch shape.
struct EvalOptions {
  std::vector<int> rows;  // per micro-batch
  bool bf16 = false;
};

// Per-token cross-entropy summed over this rank's counted tokens, and their
// count. Only ranks that own a loss count it (the last pipeline stage, tp
// rank 0), so the sums over the world are the totals, whatever the layout.
struct EvalSums {
  double loss_sum = 0;
  double tokens = 0;
  EvalSums& operator+=(const EvalSums& o) {
    loss_sum += o.loss_sum;
    tokens += o.tokens;
    return *this;
  }
};

// The loss pieces of the first `rows` rows of the head's input x [B, T, C]:
// head_loss (a mean over a row's tokens) per row, times the row's tokens on
// this rank (targets [B, T], T local under context parallelism). Collective
// over tp (every tp rank calls it); counted on tp rank 0 only.
EvalSums head_loss_rows(model::GptImpl& model, const at::Tensor& x, const at::Tensor& targets, int rows);

class Schedule {
 public:
  virtual ~Schedule() = default;
  // One step's forwards and backwards; gradient communication through
  // `sync` (begin_micro per micro-step; the caller calls finish()). Returns
  // the sum over micro-steps of the micro-batch mean loss (unscaled).
  virtual double run(ModelParts& parts, GradSync& sync, BatchSource& batches,
                     const StepOptions& options) = 0;
  // Forward only over options.rows.size() micro-batches (no gradient, no
  // optimizer, nothing of the training state changes). Collective over the
  // groups the forward uses, on every rank the same number of micro-batches.
  virtual EvalSums evaluate(ModelParts& parts, BatchSource& batches, const EvalOptions& options) = 0;
  virtual const char* name() const = 0;
  // What the schedule measured over the run, for this rank's log at the end
  // ("" when it has nothing to say).
  virtual std::string summary() const { return {}; }
};

std::unique_ptr<Schedule> make_no_pipeline();

}  // namespace dtrain::engine::parallel
