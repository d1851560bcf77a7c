// The train.nonfinite policy: counts the steps whose gradient norm or loss is
// not finite (NaN or inf), warns on each, and stops the run after
// train.nonfinite_patience of them in a row (train.nonfinite = stop). Does
// not skip the update itself (trainer.cpp does, on the same verdict) and does
// not decide about checkpoints (checkpoint::after_step is told the verdict).
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"

namespace dtrain::engine::trainer {

class NonfiniteWatch {
 public:
  explicit NonfiniteWatch(const JobSpec& spec) : spec_(spec) {}

  // After step `step` (from 1) on every rank with the same arguments: the
  // global-batch loss (NaN when not computed this step) and the gradient
  // norm before clipping. A finite step resets the count. Warns on the log
  // rank; throws dtrain::Error(config) naming the step, the values and the
  // fix when train.nonfinite = stop and the count reaches the patience.
  void observe(int64_t step, bool finite, double loss, double grad_norm, bool log_rank);

 private:
  const JobSpec& spec_;
  int64_t in_a_row_ = 0;
  int64_t first_ = 0;  // the first step of the current run of non-finite steps
};

// "nan", "inf", "-inf" or the value with 6 significant digits.
std::string value_text(double v);

}  // namespace dtrain::engine::trainer
