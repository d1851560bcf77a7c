// The job spec's log.trace.steps: [FROM, TO], two steps inside [1, train.steps]
// with FROM <= TO; a long range is legal but warned about (the trace grows
// with every step). Problems are collected like the rest of validate_spec.
#include <string>

#include "common/spec_detail.h"

namespace dtrain::detail {

constexpr int kTraceStepsWarn = 50;

void validate_trace(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const std::vector<int>& v = s.log.trace_steps;
  const std::string path = "log.trace.steps";
  if (v.empty() || origin.any_bad({path, "train.steps"})) return;
  std::string shown = "[";
  for (size_t i = 0; i < v.size(); ++i) shown += (i ? ", " : "") + std::to_string(v[i]);
  shown = path + " = " + shown + "]";
  auto error = [&](const std::string& text) { problems.error(origin.where(path), shown + ": " + text); };
  const std::string steps = std::to_string(s.train.steps);
  if (v.size() != 2) return error("give two steps [FROM, TO] (inclusive), e.g. [2, 3]");
  if (v[0] > v[1]) return error("FROM is after TO; write the earlier step first, e.g. [" +
                                std::to_string(v[1]) + ", " + std::to_string(v[0]) + "]");
  if (v[0] < 1 || v[1] > s.train.steps)
    return error("steps count from 1 to train.steps = " + steps + "; trace a range inside [1, " + steps + "]");
  const int n = v[1] - v[0] + 1;
  if (n > kTraceStepsWarn)
    problems.warn(shown + " traces " + std::to_string(n) + " steps: every rank keeps them in memory and writes them "
                  "(megabytes per step with tensor parallelism); a few steps show the pattern, e.g. [" +
                  std::to_string(v[0]) + ", " + std::to_string(v[0] + 1) + "]");
}

}  // namespace dtrain::detail
