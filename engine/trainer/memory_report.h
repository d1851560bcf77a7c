// The end-of-run memory report: every rank's persistent bytes (parameters,
// gradients, optimizer state as this rank holds them under its layout) and
// its peak live tensor bytes over the run, gathered to rank 0 and written
// as <run dir>/memory.tsv, which `dtrain launch --memory-report` prints.
#pragma once

#include <cstdint>

#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {

// Collective over the world (control group). run_peak: this rank's largest
// step peak (counting allocator). Rank 0 writes the file when the run has a
// directory.
void write_memory_report(TrainSession& s, int64_t run_peak);

}  // namespace dtrain::engine::trainer
