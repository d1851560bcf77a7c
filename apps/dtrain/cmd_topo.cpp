// `dtrain topo SPEC`: show where every rank runs, every group, the link tier
// it crosses and its bytes per step, for the spec's cluster or one described
// by flags. Only CLI wiring: the placement is rendezvous::place_job, the same
// call the live rendezvous makes.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "common/safe_output.h"
#include "plan/model_size.h"
#include "rendezvous/topology.h"

namespace dtrain::app {
namespace {

struct TopoOptions {
  std::string spec;
  std::vector<std::string> sets;
  int nodes = 0;          // 0 = from the spec
  int gpus_per_node = 0;  // 0 = from the spec
  int nvlink_domain = -1; // -1 = from the spec
  std::string format = "text";
  std::string svg;
  bool allow_slow = false;
  bool force = false;
  bool schedule = false;
};

// Flags become spec overrides, applied after --set, so validation sees the
// cluster they describe (world = nodes x procs_per_node and so on).
std::vector<std::string> topo_overrides(const TopoOptions& o) {
  std::vector<std::string> out = o.sets;
  if (o.nodes > 0) out.push_back("cluster.nodes=" + std::to_string(o.nodes));
  if (o.gpus_per_node > 0) {
    out.push_back("cluster.procs_per_node=" + std::to_string(o.gpus_per_node));
    out.push_back("cluster.device=cuda");
  }
  if (o.nvlink_domain >= 0)
    out.push_back("cluster.topology.nvlink_domain=" + std::to_string(o.nvlink_domain));
  if (o.allow_slow) out.push_back("cluster.topology.allow_slow=true");
  return out;
}

// "[2, 1, 1]": the blocks of each global stage (layers_per_stage or even).
std::string stage_blocks(const JobSpec& spec) {
  std::string out = "[";
  for (int n : spec.stage_layers()) out += (out.size() > 1 ? ", " : "") + std::to_string(n);
  return out + "]";
}

// --schedule: each pipeline stage's action list for one step, as the
// engine builds and simulates it, with the predicted bubble. A plan the
// simulator rejects is an error here, before any worker runs.
void print_schedule(const JobSpec& spec) {
  const std::string plan = checked_pipeline_plan(spec);
  std::cout << "\npipeline schedule " << to_string(spec.parallel.pipeline_schedule) << ", pp " << spec.parallel.pp << ", "
            << spec.train.grad_accum << " micro-batch(es) per step (train.grad_accum), blocks per stage "
            << stage_blocks(spec) << ":\n"
            << plan;
}

void run_topo(const TopoOptions& o) {
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(o.spec, topo_overrides(o), &warnings);
  plan::check_model_size(spec);
  if (o.nvlink_domain >= 0 && spec.cluster.device != DeviceKind::cuda)
    warnings.push_back("--nvlink-domain is ignored on a CPU cluster (cluster.device = " +
                       to_string(spec.cluster.device) + "); give --gpus-per-node to describe GPU nodes");
  rendezvous::Placement placement = rendezvous::place_job(spec, spec.cluster.topology.allow_slow, warnings);
  rendezvous::Cluster cluster = rendezvous::cluster_from_spec(spec);
  if (!o.svg.empty())
    write_file_safely(o.svg, rendezvous::placement_to_svg(placement, cluster), "--svg",
                      o.force ? Clobber::replace : Clobber::refuse);
  if (o.format == "json")
    std::cout << rendezvous::placement_to_json(placement);
  else
    std::cout << rendezvous::placement_to_text(placement, cluster);
  if (o.schedule) print_schedule(spec);
}

void add_topo(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<TopoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "Show the placement of ranks on the mesh: devices, groups, link tiers, bytes/step");
  cmd->add_option("spec", opts->spec, "Job spec (YAML)")->required();
  cmd->add_option("--set", opts->sets, "Override a spec field: key.path=value (value read as YAML)");
  cmd->add_option("--nodes", opts->nodes, "Describe a cluster of N nodes (cluster.nodes)")
      ->check(CLI::Range(1, kMaxNodes));
  cmd->add_option("--gpus-per-node", opts->gpus_per_node,
                  "GPUs per node (cluster.procs_per_node, cluster.device=cuda)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--nvlink-domain", opts->nvlink_domain,
                  "GPUs per NVLink island; larger than a node = islands spanning nodes "
                  "(cluster.topology.nvlink_domain)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--format", opts->format, "Output format")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--svg", opts->svg, "Also draw the mesh as SVG into FILE (a new file)");
  cmd->add_flag("--force", opts->force, "Replace the --svg file when it exists");
  cmd->add_flag("--schedule", opts->schedule,
                "Also print each pipeline stage's action list and the predicted bubble");
  cmd->add_flag("--allow-slow", opts->allow_slow,
                "Accept a TP group that crosses NVLink islands (warn instead of refusing)");
  cmd->callback([opts, &exit_code] {
    run_topo(*opts);
    exit_code = 0;
  });
}

}  // namespace
}  // namespace dtrain::app

DTRAIN_REGISTER_COMMAND(20, dtrain::app::add_topo);
