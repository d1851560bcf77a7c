// Checks of what a spec names on this machine, made by the launcher before
// any worker starts (the engine would find the same problems only after
// every worker had loaded LibTorch): the data file and the training state's
// memory. The run directories are checked when they are locked
// (run_dir_lock.h). Pure reads: nothing is created here.
#pragma once

#include "common/job_spec.h"

namespace dtrain::launcher {

// data.path (and data.valid.path) of the builtin trainer: each a regular file holding at least
// model.seq_len + 1 tokens of data.format (nothing for synthetic data or a
// custom entrypoint); for indexed, the PREFIX.idx/.bin pair's header and
// sizes (common/indexed_format.h). Throws dtrain::Error(config) naming the file.
// Checks data.valid.blend's files first (check_valid_blend_files).
void check_data_file(const JobSpec& spec);

// data.valid.blend's files alone, as check_data_file checks data.valid.path
// (`dtrain validate` runs it for every data.format). Throws
// dtrain::Error(config) naming data.valid.blend[i].path.
void check_valid_blend_files(const JobSpec& spec);

}  // namespace dtrain::launcher
