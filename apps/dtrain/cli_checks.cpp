// Checks of command-line input shared by several subcommands: node rank and
// console ranks against the spec, the pipeline plan the spec asks for (built
// and simulated as the engine will), and subcommand names against the CLI
// tree (with did-you-mean). No spec rules here: those are common/job_spec.
#include <algorithm>
#include <string>
#include <vector>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/spec_detail.h"
#include "plan/pipeline_plan.h"

namespace dtrain::app {

void check_node_and_ranks(const JobSpec& spec, int node_rank, const std::vector<int>& ranks) {
  const int nodes = spec.cluster.nodes_max, world = spec.world();
  if (node_rank >= nodes)
    throw Error(ErrorCode::config,
                "--node-rank " + std::to_string(node_rank) + ": the job has cluster.nodes = " +
                    std::to_string(nodes) + ", node ranks 0.." + std::to_string(nodes - 1),
                "give a node rank below " + std::to_string(nodes));
  for (int r : ranks)
    if (r < 0 || r >= world)
      throw Error(ErrorCode::config,
                  "--ranks " + std::to_string(r) + ": the job has " + std::to_string(world) +
                      " rank(s), 0.." + std::to_string(world - 1),
                  "list ranks between 0 and " + std::to_string(world - 1) + ", e.g. --ranks 0");
}

std::string checked_pipeline_plan(const JobSpec& spec) {
  namespace pl = plan::pipeline;
  const pl::PlanSpec p = pl::plan_spec_from(spec);
  const pl::Plan plan = pl::build_plan(p);
  const pl::SimResult sim = pl::simulate(p, plan);
  if (!sim.ok)
    throw Error(ErrorCode::config,
                "parallel.pipeline.schedule = " + to_string(p.kind) + ": the simulator rejects its plan: " + sim.error,
                "use parallel.pipeline.schedule 1f1b or gpipe");
  return pl::format_plan(p, plan);
}

void check_subcommands(const CLI::App& app, int argc, char** argv) {
  const CLI::App* cur = &app;
  std::string path = "dtrain";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;  // options of the groups take no values
    const auto subs = cur->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return;  // a command's own arguments from here on
    std::vector<std::string> names;
    for (const CLI::App* s : subs) names.push_back(s->get_name());
    auto it = std::find(names.begin(), names.end(), word);
    if (it != names.end()) {
      cur = subs[size_t(it - names.begin())];
      path += " " + word;
      continue;
    }
    std::string closest, list;
    size_t best = word.size() / 2 + 2;  // only suggest plausible typos
    for (const auto& n : names) {
      list += (list.empty() ? "" : ", ") + n;
      size_t d = dtrain::detail::edit_distance(word, n);
      if (d < best) best = d, closest = n;
    }
    throw Error(ErrorCode::config,
                "'" + word + "' is not a subcommand of " + path +
                    (closest.empty() ? "" : " (did you mean " + closest + "?)") +
                    "; valid: " + list,
                "see " + path + " --help");
  }
}

}  // namespace dtrain::app
