// Floating-point work of one training step of the whole job, from the spec:
// the GPT's matmuls forward, backward (twice the forward) and recompute.
// 2 FLOPs per multiply-add. `dtrain plan` prints it and divides it by the
// matmul rate for its step time (the trainer's MFU: engine/trainer/mfu.h).
#pragma once

#include "common/job_spec.h"

namespace dtrain::plan {

double flops_per_step(const JobSpec& spec);

}  // namespace dtrain::plan
