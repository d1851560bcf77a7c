// Floating-point work of one training step of the whole job, from the spec:
// the model's matmuls (gpt or llama, MoE blocks by their top_k experts)
// forward, backward (twice the forward) and recompute.
// 2 FLOPs per multiply-add. `dtrain plan` prints it and divides it by the
// matmul rate for its step time (the trainer's MFU: engine/trainer/mfu.h).
#pragma once

#include "common/job_spec.h"

namespace dtrain::plan {

double flops_per_step(const JobSpec& spec);

// MFU's numerator per trained token (PaLM's convention): 6 N + 12 L h s,
// N = the weights a token is multiplied with (the head included, the
// embedding lookup not; a MoE block's top_k experts), the second term the
// scores' forward and backward; no recompute.
double flops_per_token(const ModelSpec& m);

}  // namespace dtrain::plan
