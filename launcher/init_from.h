// train.init_from at launch: checks the weights against the run's model
// before anything starts (exit 2 naming the first difference), and turns a
// Hugging Face directory into a weights-only checkpoint in the run's log.dir
// that the workers load (WorldInfo::init_from). No LibTorch: common/hf_io.h.
#pragma once

#include <string>

#include "common/job_spec.h"

namespace dtrain::launcher {

// Throws dtrain::Error(config) naming train.init_from when it is neither a
// Hugging Face model directory (config.json) nor a dtrain checkpoint, or
// holds another architecture: for a checkpoint of model.kind llama the first
// tensor whose name or shape differs (expected vs found), else the first
// model field that differs. Reads headers only.
void check_init_from(const JobSpec& spec);

// The checkpoint step directory (absolute) the workers load: a dtrain
// checkpoint as given (resolved), or a Hugging Face directory imported into
// <run_dir>/init_from (replacing an earlier import there).
std::string prepare_init_from(const JobSpec& spec, const std::string& run_dir);

}  // namespace dtrain::launcher
