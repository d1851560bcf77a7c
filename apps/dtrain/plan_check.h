// The memory budget check shared by `dtrain plan`, `validate` and `launch`:
// a spec whose predicted need per rank (plan/memory_plan.h: model states, MoE
// experts, activations, temporaries, the dataset's host copy) exceeds the
// budget is refused with the plan's table and the cheapest change that fits.
// CLI only.
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"

namespace dtrain::app {

struct BudgetSources {
  int64_t flag = 0;      // --memory-per-rank (bytes; > 0 replaces cluster.memory_per_rank)
  bool machine = false;  // also this machine's memory over cluster.procs_per_node (cpu jobs)
};

// The budget per rank: the smallest of the sources that apply. Nothing to
// check when none does. Throws dtrain::Error(config) when over, naming the
// figure, the budget, the largest part and the fix.
void check_memory_budget(const JobSpec& spec, BudgetSources sources = {});

}  // namespace dtrain::app
