// `dtrain launch SPEC`: load the spec (plus SLURM's node count), pick the
// node rank and rendezvous, and hand over to launcher::launch(). CLI only:
// the agent, the server and the exit-code rules live in launcher/.
#include <iostream>

#include "apps/dtrain/command.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "launcher/launch.h"
#include "launcher/slurm.h"

namespace dtrain::app {
namespace {

struct LaunchArgs {
  std::string spec;
  std::vector<std::string> sets;
  int node_rank = -1;
  std::string rdzv;
  std::vector<int> ranks;
  bool allow_slow = false;
  std::string resume_from;
  bool fresh = false;
  bool allow_large = false;
};

std::string endpoint_port(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? "29400" : endpoint.substr(colon + 1);
}

int run_launch(const LaunchArgs& args) {
  auto slurm = launcher::SlurmEnv::from_environment();
  std::vector<std::string> overrides;
  if (slurm.present) overrides.push_back("cluster.nodes=" + std::to_string(slurm.nodes));
  overrides.insert(overrides.end(), args.sets.begin(), args.sets.end());  // --set wins
  if (args.allow_slow) overrides.push_back("cluster.topology.allow_slow=true");
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(args.spec, overrides, &warnings);
  for (const auto& w : warnings) DTRAIN_WARN("{}", w);

  check_node_and_ranks(spec, args.node_rank, args.ranks);

  launcher::LaunchOptions options;
  options.node_rank = args.node_rank >= 0 ? args.node_rank : slurm.node_rank;
  options.rdzv = args.rdzv;
  if (options.rdzv.empty() && slurm.present && slurm.nodes > 1 && !slurm.first_host.empty())
    options.rdzv = slurm.first_host + ":" + endpoint_port(spec.cluster.rendezvous.endpoint);
  if (options.node_rank < 0 && spec.cluster.nodes_max == 1) options.node_rank = 0;
  options.console_ranks = args.ranks;
  options.allow_slow = spec.cluster.topology.allow_slow;
  options.resume_from = args.resume_from;
  options.fresh = args.fresh;
  options.allow_large = args.allow_large;
  return launcher::launch(spec, options);
}

void add_launch(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand(
      "launch", "rendezvous, place ranks, spawn and supervise this node's workers");
  cmd->add_option("spec", args->spec, "job spec (YAML)")->required();
  cmd->add_option("--set", args->sets, "override a spec field: key.path=value (YAML value)");
  cmd->add_option("--node-rank", args->node_rank,
                  "this machine's node rank (node 0 hosts the rendezvous; default: SLURM_NODEID)")
      ->check(CLI::Range(0, kMaxNodes - 1));
  cmd->add_option("--rdzv", args->rdzv,
                  "HOST:PORT of the rendezvous (default: cluster.rendezvous.endpoint, or the "
                  "first SLURM host)");
  cmd->add_option("--ranks", args->ranks, "ranks whose output reaches the console, e.g. 0,3")
      ->delimiter(',');
  cmd->add_flag("--allow-slow", args->allow_slow, "accept a TP group that spans NVLink islands");
  cmd->add_option("--resume-from", args->resume_from,
                  "load this checkpoint first (a step_<N> dir or a checkpoint.dir); steps of "
                  "checkpoint.dir newer than it are moved aside into previous_<time>/");
  cmd->add_flag("--allow-large", args->allow_large,
                "start even when the training state looks larger than this machine's memory");
  cmd->add_flag("--fresh", args->fresh,
                "start from scratch: checkpoint.dir's old steps are moved aside into "
                "previous_<time>/ (never overwritten)");
  cmd->callback([args, &exit_code] { exit_code = run_launch(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(30, add_launch);

}  // namespace dtrain::app
