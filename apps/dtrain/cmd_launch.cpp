// `dtrain launch SPEC`: load the spec (plus SLURM's node count), pick the
// node rank and rendezvous, and hand over to launcher::launch(). CLI only:
// the agent, the server and the exit-code rules live in launcher/.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "apps/dtrain/command.h"
#include "apps/dtrain/plan_check.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "launcher/launch.h"
#include "launcher/slurm.h"
#include "plan/combinations.h"

namespace dtrain::app {
namespace {

struct LaunchArgs {
  std::string spec;
  std::vector<std::string> sets;
  int node_rank = -1;
  std::string rdzv;
  std::string advertise_addr;
  std::string hostname;
  std::vector<int> ranks;
  bool allow_slow = false;
  std::string resume_from;
  bool fresh = false;
  bool allow_large = false;
  bool memory_report = false;
};

std::string endpoint_port(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? "29400" : endpoint.substr(colon + 1);
}

// --memory-report's second table: the bytes each rank sent through its dp,
// tp and ep groups in the last step (<log.dir>/comm.tsv; ep: the MoE
// all-to-alls); empty when the file is absent.
std::string print_comm_bytes(const std::string& run_dir) {
  std::ifstream in((std::filesystem::absolute(run_dir) / "comm.tsv").string());
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  std::string table = "bytes sent per step (the last step, as each rank's groups counted them)\n";
  table += fmt::format("{:>5} {:>12} {:>12} {:>12}\n", "rank", "dp", "tp", "ep");
  while (std::getline(in, line)) {
    std::istringstream row(line);
    long long rank = 0, dp = 0, tp = 0, ep = 0;
    if (row >> rank >> dp >> tp >> ep) table += fmt::format("{:>5} {:>12} {:>12} {:>12}\n", rank, dp, tp, ep);
  }
  return table;
}

// --memory-report: the per-rank table of <log.dir>/memory.tsv, which rank 0
// of the engine writes at the end of training (engine/trainer/memory_report.h).
void print_memory_report(const std::string& run_dir) {
  const std::string path = (std::filesystem::absolute(run_dir) / "memory.tsv").string();
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    DTRAIN_WARN("--memory-report: {} was not written (a custom entrypoint, or rank 0 runs on "
                "another node)", path);
    return;
  }
  auto mib = [](long long b) { return fmt::format("{:.3f}", double(b) / (1024.0 * 1024.0)); };
  std::string table = fmt::format("memory per rank (MiB; persistent = params + grads + optimizer, "
                                  "peak = most live tensor bytes in any step), from {}\n",
                                  path);
  table += fmt::format("{:>5} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}\n", "rank", "params",
                       "grads", "optimizer", "persistent", "peak", "rss");
  while (std::getline(in, line)) {
    std::istringstream row(line);
    long long rank = 0, p = 0, g = 0, o = 0, peak = 0, rss = 0;
    if (!(row >> rank >> p >> g >> o >> peak >> rss)) continue;
    table += fmt::format("{:>5} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}\n", rank, mib(p), mib(g),
                         mib(o), mib(p + g + o), mib(peak), mib(rss));
  }
  std::cout << table << print_comm_bytes(run_dir) << std::flush;
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
  plan::check_combinations(spec);  // what the engine cannot run together
  if (spec.parallel.pp > 1 && spec.builtin_entrypoint()) checked_pipeline_plan(spec);
  // `dtrain plan`'s need per rank against cluster.memory_per_rank and this
  // machine's memory, before anything starts.
  check_memory_budget(spec, {0, !args.allow_large});

  launcher::LaunchOptions options;
  options.node_rank = args.node_rank >= 0 ? args.node_rank : slurm.node_rank;
  options.rdzv = args.rdzv;
  options.advertise_addr = args.advertise_addr;
  options.hostname = args.hostname;
  if (options.rdzv.empty() && slurm.present && slurm.nodes > 1 && !slurm.first_host.empty())
    options.rdzv = slurm.first_host + ":" + endpoint_port(spec.cluster.rendezvous.endpoint);
  if (options.node_rank < 0 && spec.cluster.nodes_max == 1) options.node_rank = 0;
  options.console_ranks = args.ranks;
  options.allow_slow = spec.cluster.topology.allow_slow;
  options.resume_from = args.resume_from;
  options.fresh = args.fresh;
  options.allow_large = args.allow_large;
  const int code = launcher::launch(spec, options);
  if (args.memory_report && code == 0 && options.node_rank <= 0) print_memory_report(spec.log.dir);
  return code;
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
  cmd->add_option("--advertise-addr", args->advertise_addr,
                  "this node's address for the other nodes (default: the local address of the "
                  "route to the rendezvous); must be an address of this host");
  cmd->add_option("--hostname", args->hostname,
                  "the name this node reports in logs and root-cause blocks (default: the "
                  "machine's hostname; containers often have a meaningless one)");
  cmd->add_option("--ranks", args->ranks, "ranks whose output reaches the console, e.g. 0,3")
      ->delimiter(',');
  cmd->add_flag("--allow-slow", args->allow_slow, "accept a TP group that spans NVLink islands");
  cmd->add_option("--resume-from", args->resume_from,
                  "load this checkpoint first (a step_<N> dir or a checkpoint.dir); steps of "
                  "checkpoint.dir newer than it are moved aside into previous_<time>/");
  cmd->add_flag("--allow-large", args->allow_large,
                "start even when the predicted memory per rank (dtrain plan) is more than this machine's "
                "memory over cluster.procs_per_node");
  cmd->add_flag("--fresh", args->fresh,
                "start from scratch: checkpoint.dir's old steps are moved aside into "
                "previous_<time>/ (never overwritten)");
  cmd->add_flag("--memory-report", args->memory_report,
                "print each rank's parameter, gradient, optimizer and peak bytes at the end");
  cmd->callback([args, &exit_code] { exit_code = run_launch(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(30, add_launch);

}  // namespace dtrain::app
