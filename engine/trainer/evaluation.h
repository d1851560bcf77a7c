// Validation (data.valid) and `dtrain eval`: the mean next-token
// cross-entropy over the first K windows of the validation source, in order,
// forward only. One evaluate() serves both the training loop and the eval
// worker, so their numbers are the same. Owns the window assignment and the
// reduction; the forward pass is the Schedule's (schedule.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "engine/data/dataset.h"

namespace dtrain::engine::trainer {

struct TrainSession;

// The windows of data.path the training sampler draws from: all but the
// tail that data.valid.split holds out. Throws dtrain::Error(config) when the
// split holds out no window.
int64_t training_windows(const JobSpec& spec, int64_t windows);

// Where validation windows come from: data.valid.path's file, the tail of
// data.path that data.valid.split holds out, one file of data.valid.blend,
// or (no data.valid: `dtrain eval` only) data.path from its first window.
struct EvalSource {
  const data::TokenDataset* data = nullptr;
  std::unique_ptr<data::TokenDataset> owned;  // data.valid.path's (or a blend file's), when opened here
  int64_t first = 0;                          // window ids first, first + 1, ...
  int64_t available = 0;                      // windows from `first` on
  std::string what;                           // for messages: "data.valid.path = v.txt"
  std::string name;     // a data.valid.blend file's base name (val_loss_by_source's key); "" otherwise
  int64_t windows = 0;  // windows evaluated from `first` on (eval_sources)
};
// The one source of data.valid.path, data.valid.split or data.path (not a
// blend). Throws dtrain::Error(config) naming data.valid.batches when the
// source holds fewer than `windows` windows.
EvalSource eval_source(const JobSpec& spec, const data::TokenDataset& train, int64_t windows);

// The sources of the first `windows` validation windows: eval_source's one
// source, or data.valid.blend's files. A blend's position p (0 <= p <
// windows) is drawn by data.blend's rule (BlendSchedule over the normalised
// weights, indexed_blend.h) and is the next unread window of its source, so
// file j gives its windows 0 .. n_j - 1 in order, n_j = its draws among the
// first `windows` positions (0 for a file the blend never reaches: it is
// left out of the figures). The same on every layout. Throws
// dtrain::Error(config) naming the entry when a file cannot be opened or
// holds fewer than n_j windows.
std::vector<EvalSource> eval_sources(const JobSpec& spec, const data::TokenDataset& train, int64_t windows);

struct EvalResult {
  double loss = 0;     // mean per-token cross-entropy (no MoE aux loss)
  double ppl = 0;      // exp(loss)
  int64_t tokens = 0;  // counted: windows x model.seq_len
  double seconds = 0;  // wall time of the evaluation
  // data.valid.blend: each file's own mean over its windows, by EvalSource::name.
  std::vector<std::pair<std::string, double>> by_source;
};

// Windows src.first .. src.first + windows - 1, split over dp in rounds of
// dp x micro_batch (dp rank d takes rows [d * mb, (d+1) * mb) of a round; the
// last round is filled with repeats that are not counted), forward only with
// autograd and dropout off; per-token losses and token counts are summed
// over the world, then divided. Collective over the world; training state
// (weights, optimizer, sampler, RNG) is left unchanged.
EvalResult evaluate(TrainSession& s, const EvalSource& src, int64_t windows);
// Every source's windows (eval_sources), one evaluate() each, in order: the
// loss is the sum of their token losses over the sum of their tokens (the
// mean over all the windows), and named sources report their own means.
EvalResult evaluate(TrainSession& s, const std::vector<EvalSource>& sources);
// eval_sources, with a warning (on the log rank) for each blend file that
// gets none of the windows.
std::vector<EvalSource> open_validation(const TrainSession& s, int64_t windows);

// The worker's eval mode (`dtrain eval`, WorldInfo::eval): builds the
// session, loads the model of eval.ckpt (no optimizer state), evaluates
// eval.windows windows (of data.valid's sources, eval_sources); rank 0
// writes {"loss", "ppl", "tokens", "step"} as JSON to eval.out (with a
// blend also "loss_by_source": {name: loss}) and, when DTRAIN_EVAL_LOGITS
// names a file (`dtrain eval --logits-out`, one-rank meshes), the first
// window's logits [T, V] as float32 .npy there. Returns the exit code.
int run_evaluation();

}  // namespace dtrain::engine::trainer
