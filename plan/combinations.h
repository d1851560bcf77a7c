// Which features the builtin engine runs together, decided from the spec
// alone so that `dtrain validate`, `launch` and `resume` refuse a spec before
// any worker starts, and the engine refuses it again at start (a worker
// given a spec some other way). One field's own range is the spec
// validator's (common/); rules between features are here.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// Every rule the spec breaks, one line each naming the fields, their values
// and the fix. Rules belong to the parallelism or feature that imposes them
// (a table in combinations.cpp: a new parallelism adds its own row).
std::vector<std::string> combination_problems(const JobSpec& spec);

// check_model_size, then for the builtin entrypoint: throws
// dtrain::Error(config) listing every combination_problems line.
void check_combinations(const JobSpec& spec);

}  // namespace dtrain::plan
