// NonfiniteWatch (nonfinite.h). The verdict comes from values every rank
// holds identically (the global gradient norm, the dp-reduced loss), so every
// rank counts, warns and stops at the same step without a collective of its own.
#include "engine/trainer/nonfinite.h"

#include <cmath>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::trainer {
namespace {

// Where a resume would start: the checkpoint `latest` names (only finite
// state is ever saved, so it is the last finite one).
std::string last_checkpoint(const JobSpec& spec) {
  if (spec.checkpoint.dir.empty()) return "";
  try {
    return dtrain::checkpoint::latest_dir(spec.checkpoint.dir);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

std::string value_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", v);
}

void NonfiniteWatch::observe(int64_t step, bool finite, double loss, double grad_norm, bool log_rank) {
  if (finite) {
    in_a_row_ = 0;
    return;
  }
  if (in_a_row_++ == 0) first_ = step;
  const auto& t = spec_.train;
  const bool stop = t.nonfinite == NonfiniteAction::stop && in_a_row_ >= t.nonfinite_patience;
  const std::string values = "loss " + value_text(loss) + ", gradient norm " + value_text(grad_norm);
  if (log_rank && !stop)
    DTRAIN_WARN("step {}/{}: {}: not finite; every rank skips this step's update and no checkpoint is "
                "written after it ({} in a row; {})",
                step, t.steps, values, in_a_row_,
                t.nonfinite == NonfiniteAction::stop
                    ? "train.nonfinite = stop stops at train.nonfinite_patience = " +
                          std::to_string(t.nonfinite_patience)
                    : std::string("train.nonfinite = skip_step goes on"));
  if (!stop) return;
  const std::string last = last_checkpoint(spec_);
  const std::string steps = in_a_row_ == 1 ? "step " + std::to_string(step)
                                           : "steps " + std::to_string(first_) + "-" + std::to_string(step);
  throw Error(ErrorCode::config,
              "training diverged: step " + std::to_string(step) + " has " + values + ", not finite in " +
                  std::to_string(in_a_row_) + " step(s) in a row (" + steps +
                  "; train.nonfinite_patience = " + std::to_string(t.nonfinite_patience) +
                  "); stopped without saving: " +
                  (last.empty() ? std::string("no checkpoint was written")
                                : "the last checkpoint, from finite state, is " + last),
              "lower train.lr (now " + value_text(t.lr) + "), clip gradients with train.grad_clip (now " +
                  value_text(t.grad_clip) + (t.grad_clip > 0 ? "" : ", off; e.g. 1.0") +
                  ") or lengthen train.warmup_steps (now " + std::to_string(t.warmup_steps) + ")" +
                  (last.empty() ? "" : ", then continue from it with dtrain resume --ckpt " + last) +
                  "; train.nonfinite: skip_step skips such steps instead");
}

}  // namespace dtrain::engine::trainer
