// The end-of-run memory report: every rank's persistent bytes (parameters,
// gradients, optimizer state as this rank holds them under its layout) and
// its peak live tensor bytes over the run, gathered to rank 0 and written
// as <run dir>/memory.tsv, and the bytes each rank's groups sent in the
// last step as <run dir>/comm.tsv; `dtrain launch --memory-report` prints both.
#pragma once

#include <cstdint>

#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {

// Bytes this rank sent through its dp, tp and ep groups in one step.
struct StepBytes {
  int64_t dp = 0, tp = 0, ep = 0, cp = 0;
};

// Collective over the world (control group). run_peak: this rank's largest
// step peak (counting allocator); last_step: the bytes of the run's last
// step, written beside it as <run dir>/comm.tsv. Rank 0 writes the files
// when the run has a directory.
void write_memory_report(TrainSession& s, int64_t run_peak, const StepBytes& last_step);

}  // namespace dtrain::engine::trainer
