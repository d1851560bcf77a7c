// The memory budget check shared by `dtrain plan` and `dtrain launch`: a spec
// whose predicted peak (engine/planner) exceeds the budget is refused with
// the plan's table and the cheapest single change that fits. CLI only.
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"

namespace dtrain::app {

// budget: bytes per rank (<= 0: cluster.memory_per_rank, and nothing to
// check when that is empty too). Throws dtrain::Error(config) when over.
void check_memory_budget(const JobSpec& spec, int64_t budget = 0);

}  // namespace dtrain::app
