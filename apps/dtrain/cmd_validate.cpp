// `dtrain validate SPEC [--set k=v]... [--format text|json]`: load and check a
// job spec, print it resolved (every field, defaults filled in), then the
// derived values and warnings. Only CLI wiring: the rules are common/job_spec
// and plan/combinations.h.
// stdout stays machine-readable: text is YAML (derived values as # comments)
// that load_job_spec reads back; json is one JSON object. The predicted
// memory per rank (`dtrain plan`'s, apps/dtrain/plan_check.h) must fit
// this machine's memory unless --allow-large.
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/dtrain/command.h"
#include "apps/dtrain/plan_check.h"
#include "launcher/input_checks.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "plan/combinations.h"
#include "plan/memory_plan.h"
#include "plan/model_size.h"

namespace dtrain::app {
namespace {

struct ValidateOptions {
  std::string spec;
  std::vector<std::string> sets;
  std::string format = "text";
  bool allow_large = false;
};

nlohmann::ordered_json derived_json(const JobSpec& s) {
  nlohmann::ordered_json d;
  d["world"] = s.world();
  d["mesh"] = {{"dp", s.parallel.dp}, {"tp", s.parallel.tp}, {"pp", s.parallel.pp},
               {"ep", s.parallel.ep}};
  d["nodes"] = {{"min", s.cluster.nodes_min}, {"max", s.cluster.nodes_max}};
  d["ranks_per_node"] = s.ranks_per_node();
  d["global_batch"] = s.global_batch();
  d["tokens_per_step"] = s.tokens_per_step();
  const plan::ModelSize size = plan::model_size(s);
  d["params"] = size.params;
  d["train_state_bytes_per_rank"] = size.rank_bytes;
  try {
    d["predicted_peak_bytes_per_rank"] = plan::plan_memory(s).max_need_bytes();
  } catch (const Error&) {
    d["predicted_peak_bytes_per_rank"] = nullptr;  // a layout only the engine refuses
  }
  return d;
}

void print_json(const JobSpec& spec, const std::vector<std::string>& warnings) {
  nlohmann::ordered_json out;
  out["source"] = spec.source;
  out["spec"] = nlohmann::ordered_json::parse(job_spec_to_json(spec));
  out["derived"] = derived_json(spec);
  out["warnings"] = warnings;
  std::cout << out.dump(2) << "\n";
}

void print_text(const JobSpec& spec, const std::vector<std::string>& warnings) {
  std::cout << job_spec_to_yaml(spec);
  std::cout << "\n# derived (" << spec.source << " is valid)\n";
  std::istringstream summary(job_spec_summary(spec));
  for (std::string line; std::getline(summary, line);) std::cout << "#   " << line << "\n";
  for (const auto& w : warnings) std::cout << "# warning: " << w << "\n";
  // Warnings also go to stderr, where a redirected stdout does not hide them.
  for (const auto& w : warnings) std::cerr << "dtrain: warning: " << w << "\n";
}

void run_validate(const ValidateOptions& o) {
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(o.spec, o.sets, &warnings);
  plan::check_combinations(spec);  // what the engine cannot run together, before the figures
  check_memory_budget(spec, {0, !o.allow_large});
  // Indexed datasets are opened here as launch opens them (header, ends, vocabulary).
  if (spec.data.format == DataFormat::indexed && spec.builtin_entrypoint()) launcher::check_data_file(spec);
  else launcher::check_valid_blend_files(spec);  // any format: data.valid.blend's files, as launch checks them
  if (o.format == "json")
    print_json(spec, warnings);
  else
    print_text(spec, warnings);
}

void add_validate(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check a job spec and print it resolved, with derived values and warnings");
  cmd->add_option("spec", opts->spec, "Job spec (YAML)")->required();
  cmd->add_option("--set", opts->sets,
                  "Override a spec field: key.path=value (value read as YAML; repeatable)");
  cmd->add_option("--format", opts->format, "Output format")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--allow-large", opts->allow_large,
                "Accept a spec whose predicted memory per rank (dtrain plan) is more than this "
                "machine's memory over cluster.procs_per_node");
  cmd->callback([opts, &exit_code] {
    run_validate(*opts);
    exit_code = 0;
  });
}

}  // namespace
}  // namespace dtrain::app

DTRAIN_REGISTER_COMMAND(10, dtrain::app::add_validate);
