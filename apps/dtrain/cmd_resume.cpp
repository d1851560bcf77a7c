// `dtrain resume --ckpt DIR [--set k=v]... [--spec FILE]`: continue a run
// from a checkpoint. DIR is a run's checkpoint.dir (its `latest`) or one
// step_<N>; the spec is the one stored in the checkpoint, with overrides
// (more steps, another mesh), minus what a checkpoint may not decide
// (common/resume_spec.h), or FILE. CLI only: the format is common/,
// launching is launcher/.
#include <filesystem>

#include "apps/dtrain/command.h"
#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "apps/dtrain/plan_check.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/resume_spec.h"
#include "launcher/launch.h"
#include "plan/combinations.h"

namespace dtrain::app {
namespace {

struct ResumeArgs {
  std::string ckpt;
  std::vector<std::string> sets;
  int node_rank = -1;
  std::string rdzv;
  std::vector<int> ranks;
  bool allow_large = false;
  std::string spec_file;
};

int run_resume(const ResumeArgs& args) {
  const std::string dir = checkpoint::resolve(args.ckpt);
  checkpoint::CheckpointReader reader(dir);  // the index checked, every rank file a regular file
  reader.check_headers();  // every shard's entry in its file, before any worker starts
  const checkpoint::Index& x = reader.index();
  ResumeSpecInput in;
  in.stored_yaml = x.spec_yaml;
  in.source = dir + "/index.json (spec)";
  in.spec_file = args.spec_file;
  in.overrides = args.sets;
  in.checkpoint_root = std::filesystem::absolute(dir).parent_path().lexically_normal().string();
  in.rdzv_given = !args.rdzv.empty();
  std::vector<std::string> warnings;
  JobSpec spec = resume_spec(in, &warnings);
  for (const auto& w : warnings) DTRAIN_WARN("{}", w);
  if (args.spec_file.empty()) spec.source = in.source;
  DTRAIN_INFO("resuming {} from {}: step {} of {}, saved on mesh {}", spec.job.name, dir, x.step,
              spec.train.steps, x.mesh);
  if (x.step >= spec.train.steps)
    DTRAIN_WARN("the checkpoint is at step {} and train.steps = {}: nothing to train; "
                "use --set train.steps=<more>", x.step, spec.train.steps);

  check_node_and_ranks(spec, args.node_rank, args.ranks);
  plan::check_combinations(spec);  // a --set may ask for what the engine cannot run together
  // The same memory check as launch, after --set (a resume may change sizes).
  check_memory_budget(spec, {0, !args.allow_large});
  launcher::LaunchOptions options;
  options.allow_large = args.allow_large;
  options.node_rank = args.node_rank;
  if (options.node_rank < 0 && spec.cluster.nodes_max == 1) options.node_rank = 0;
  options.rdzv = args.rdzv;
  options.console_ranks = args.ranks;
  // Workers load exactly this checkpoint on the first launch; an agent
  // restart after that loads `latest` (DTRAIN_RESTART > 0). Steps newer than
  // it are moved aside first (launcher/checkpoint_start.h).
  options.resume_from = std::filesystem::absolute(dir).string();
  return launcher::launch(spec, options);
}

void add_resume(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ResumeArgs>();
  auto* cmd = app.add_subcommand("resume", "continue a run from its checkpoint (spec from the checkpoint)");
  cmd->add_option("--ckpt", args->ckpt, "a run's checkpoint.dir (uses latest) or one step_<N>")->required();
  cmd->add_option("--set", args->sets, "override a stored spec field: key.path=value (YAML value)");
  cmd->add_option("--spec", args->spec_file,
                  "the run's spec file, used instead of the one stored in the checkpoint");
  cmd->add_option("--node-rank", args->node_rank, "this machine's node rank (node 0 hosts the rendezvous)")
      ->check(CLI::Range(0, kMaxNodes - 1));
  cmd->add_flag("--allow-large", args->allow_large,
                "start even when the training state looks larger than this machine's memory");
  cmd->add_option("--rdzv", args->rdzv, "HOST:PORT of the rendezvous");
  cmd->add_option("--ranks", args->ranks, "ranks whose output reaches the console")->delimiter(',');
  cmd->callback([args, &exit_code] { exit_code = run_resume(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(35, add_resume);

}  // namespace dtrain::app
