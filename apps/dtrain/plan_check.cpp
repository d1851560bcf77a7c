// check_memory_budget (plan_check.h): the candidates are single changes of
// the spec that lower memory, cheapest first by what they cost (no extra
// compute or traffic, then more traffic, then recomputation); the first
// whose predicted peak fits is the suggestion.
#include "apps/dtrain/plan_check.h"

#include <string>
#include <utility>
#include <vector>

#include "common/byte_size.h"
#include "common/error.h"
#include "engine/planner/memory_plan.h"

namespace dtrain::app {
namespace {

namespace pl = engine::planner;

// (--set text, applied change) in order of cost.
std::vector<std::pair<std::string, JobSpec>> cheaper_layouts(const JobSpec& spec) {
  std::vector<std::pair<std::string, JobSpec>> out;
  auto add = [&](const std::string& what, auto change) {
    JobSpec s = spec;
    change(s);
    out.emplace_back(what, s);
  };
  if (spec.model.attention == "naive") add("model.attention=tiled", [](JobSpec& s) { s.model.attention = "tiled"; });
  for (int z = spec.parallel.zero + 1; z <= 3 && spec.parallel.dp > 1; ++z)
    if (!(z == 3 && spec.parallel.pp > 1))
      add("parallel.zero=" + std::to_string(z), [z](JobSpec& s) { s.parallel.zero = z; });
  if (spec.train.recompute == "none")
    add("train.recompute=selective", [](JobSpec& s) { s.train.recompute = "selective"; });
  if (spec.train.recompute != "full") add("train.recompute=full", [](JobSpec& s) { s.train.recompute = "full"; });
  if (spec.train.micro_batch % 2 == 0)
    add("train.micro_batch=" + std::to_string(spec.train.micro_batch / 2) +
            " train.grad_accum=" + std::to_string(spec.train.grad_accum * 2),
        [](JobSpec& s) { s.train.micro_batch /= 2, s.train.grad_accum *= 2; });
  return out;
}

}  // namespace

void check_memory_budget(const JobSpec& spec, int64_t budget) {
  if (budget <= 0) {
    if (spec.cluster.memory_per_rank.empty()) return;
    budget = parse_byte_size(spec.cluster.memory_per_rank);
  }
  const pl::MemoryPlan plan = pl::plan_memory(spec);
  if (plan.max_peak_bytes() <= budget) return;
  std::string fix = "no single change of attention, zero, recompute or micro_batch fits; add ranks (dp, tp or pp)";
  for (const auto& [what, s] : cheaper_layouts(spec)) {
    int64_t peak = 0;
    try {
      peak = pl::plan_memory(s).max_peak_bytes();
    } catch (const Error&) {
      continue;
    }
    if (peak <= budget) {
      fix = "the cheapest change that fits: --set " + what + " (predicted peak " + pl::format_bytes(double(peak)) + ")";
      break;
    }
  }
  throw Error(ErrorCode::config,
              "cluster.memory_per_rank = " + pl::format_bytes(double(budget)) + " is below the predicted peak " +
                  pl::format_bytes(double(plan.max_peak_bytes())) + " (dtrain plan):\n" + pl::plan_to_text(spec, plan),
              fix);
}

}  // namespace dtrain::app
