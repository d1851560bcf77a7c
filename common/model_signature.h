// The model signature a checkpoint records (index.json "model"): what must
// match for a checkpoint to resume (dropout, batch and mesh may change).
// Here, not in the engine, so the CLI's Hugging Face import writes the same.
#pragma once

#include <string>

#include "common/job_spec.h"

namespace dtrain::checkpoint {

// "gpt vocab=256 layers=2 d_model=64 heads=4 seq_len=64 [moe.experts=...]"
std::string model_signature(const ModelSpec& m);

}  // namespace dtrain::checkpoint
