// The launch-time checks of train.offload on this machine, before any worker
// starts: host offload needs a GPU, and nvme's train.offload.path must be an
// existing, writable directory outside checkpoint.dir with room for every
// local rank's file. Pure reads (stat, statvfs, access): nothing is created.
#pragma once

#include "common/job_spec.h"

namespace dtrain::launcher {

// Throws dtrain::Error(config) naming the train.offload field, its value and
// the fix. `gpus`: this machine's visible GPUs (gpus.h).
void check_offload(const JobSpec& spec, int gpus);

}  // namespace dtrain::launcher
