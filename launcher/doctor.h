// The launcher's side of `dtrain doctor`: the host's facts gathered here
// (no LibTorch), the engine's from running `dtrain-worker doctor` beside
// dtrain and reading its JSON; and the one-line summary `dtrain launch`
// prints at start. The warnings themselves are common/machine_facts.h's.
#pragma once

#include <string>

#include "common/machine_facts.h"

namespace dtrain {
struct JobSpec;
}

namespace dtrain::launcher {

// Runs `<worker> doctor --seconds S` and parses its stdout. A worker that is
// missing or fails gives EngineFacts{available = false, error = why}.
EngineFacts engine_facts_from_worker(const std::string& worker, double seconds);

// Host facts, the summary line and the warnings that need no engine
// (workers over cores), logged at the start of `dtrain launch`.
void log_launch_summary(const JobSpec& spec);

}  // namespace dtrain::launcher
