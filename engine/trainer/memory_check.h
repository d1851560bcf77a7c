// The planner checked against the engine: after the first steady step, this
// rank's measured bytes (GradSync::memory, AdamW's moments, the counting
// allocator's step peak) next to what plan/memory_plan.h predicts for it, logged,
// with a warning past 20% (for the peak under bf16 / fp16 autocast, where
// the plan is an upper bound, only 20% above it). Knows no parallelism: the planner does.
#pragma once

#include <cstdint>

#include "common/job_spec.h"
#include "engine/trainer/metrics.h"

namespace dtrain::engine::trainer {

class MemoryCheck {
 public:
  static constexpr double kWarnFraction = 0.20;
  // Off on a GPU (the counting allocator sees CPU tensors only) and for a
  // spec the planner cannot model.
  MemoryCheck(const JobSpec& spec, int rank, bool cpu);
  // The step (1-based) after which to compare: 2 (step 1 also allocates the
  // AdamW moments), or 1 for a one-step run.
  bool due(int64_t step) const { return enabled_ && step == check_step_; }
  void compare(const MemoryStats& measured, bool log_rank) const;

 private:
  const JobSpec& spec_;
  int rank_;
  bool enabled_;
  int64_t check_step_;
};

}  // namespace dtrain::engine::trainer
