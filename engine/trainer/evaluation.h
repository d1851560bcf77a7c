// Validation (data.valid) and `dtrain eval`: the mean next-token
// cross-entropy over the first K windows of the validation source, in order,
// forward only. One evaluate() serves both the training loop and the eval
// worker, so their numbers are the same. Owns the window assignment and the
// reduction; the forward pass is the Schedule's (schedule.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/job_spec.h"
#include "engine/data/dataset.h"

namespace dtrain::engine::trainer {

struct TrainSession;

// The windows of data.path the training sampler draws from: all but the
// tail that data.valid.split holds out. Throws dtrain::Error(config) when the
// split holds out no window.
int64_t training_windows(const JobSpec& spec, int64_t windows);

// Where validation windows come from: data.valid.path's file, the tail of
// data.path that data.valid.split holds out, or (no data.valid: `dtrain
// eval` only) data.path from its first window.
struct EvalSource {
  const data::TokenDataset* data = nullptr;
  std::unique_ptr<data::TokenDataset> owned;  // data.valid.path's, when opened here
  int64_t first = 0;                          // window ids first, first + 1, ...
  int64_t available = 0;                      // windows from `first` on
  std::string what;                           // for messages: "data.valid.path = v.txt"
};
// Throws dtrain::Error(config) naming data.valid.batches when the source
// holds fewer than `windows` windows.
EvalSource eval_source(const JobSpec& spec, const data::TokenDataset& train, int64_t windows);

struct EvalResult {
  double loss = 0;     // mean per-token cross-entropy (no MoE aux loss)
  double ppl = 0;      // exp(loss)
  int64_t tokens = 0;  // counted: windows x model.seq_len
  double seconds = 0;  // wall time of the evaluation
};

// Windows src.first .. src.first + windows - 1, split over dp in rounds of
// dp x micro_batch (dp rank d takes rows [d * mb, (d+1) * mb) of a round; the
// last round is filled with repeats that are not counted), forward only with
// autograd and dropout off; per-token losses and token counts are summed
// over the world, then divided. Collective over the world; training state
// (weights, optimizer, sampler, RNG) is left unchanged.
EvalResult evaluate(TrainSession& s, const EvalSource& src, int64_t windows);

// The worker's eval mode (`dtrain eval`, WorldInfo::eval): builds the
// session, loads the model of eval.ckpt (no optimizer state), evaluates
// eval.windows windows; rank 0 writes {"loss", "ppl", "tokens", "step"} as
// JSON to eval.out and, when DTRAIN_EVAL_LOGITS names a file (`dtrain eval
// --logits-out`, one-rank meshes), the first window's logits [T, V] as
// float32 .npy there. Returns the exit code.
int run_evaluation();

}  // namespace dtrain::engine::trainer
