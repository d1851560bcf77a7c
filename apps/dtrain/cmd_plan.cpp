// `dtrain plan SPEC`: before launching, what every rank will hold (model
// states, activations, backward temporaries, the peak), the FLOPs of a step
// and the bytes every group moves (the same numbers `dtrain topo` shows);
// `--format json`; `--memory-per-rank` (or cluster.memory_per_rank) refuses
// a layout over budget with the cheapest change that fits. CLI wiring and
// printing only: the figures are plan/ (memory_plan.h, traffic.h through
// rendezvous/topology's placement).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/dtrain/command.h"
#include "apps/dtrain/plan_check.h"
#include "apps/dtrain/plan_suggest.h"
#include "common/byte_size.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "launcher/launch.h"
#include "plan/flops.h"
#include "plan/gpt_params.h"
#include "plan/memory_plan.h"
#include "plan/model_size.h"
#include "plan/pipeline_plan.h"
#include "rendezvous/topology.h"

namespace dtrain::app {
namespace {

namespace pl = dtrain::plan;

struct PlanOptions {
  std::string spec;
  std::vector<std::string> sets;
  std::string format = "text";
  std::string memory_per_rank;
  bool probe = true;
  bool suggest = false;
  int world = 0;
};

// This CPU's one-thread GEMM rate: `dtrain-worker probe-matmul` once, then
// cached in ~/.cache/dtrain/matmul_gflops (or $XDG_CACHE_HOME). 0 when the
// worker cannot run (then no step time is estimated).
double matmul_gflops() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir = xdg && *xdg ? std::filesystem::path(xdg) / "dtrain"
                                    : home && *home ? std::filesystem::path(home) / ".cache" / "dtrain"
                                                    : std::filesystem::path();
  const std::filesystem::path cache = dir / "matmul_gflops";
  double g = 0;
  if (!dir.empty() && (std::ifstream(cache) >> g) && g > 0) return g;
  const std::string cmd = launcher::self_dir() + "/dtrain-worker probe-matmul 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return 0;
  char buf[128] = {0};
  while (std::fgets(buf, sizeof buf, f))
    if (std::sscanf(buf, "gflops=%lf", &g) == 1) break;
  pclose(f);
  if (g > 0 && !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream(cache) << g << "\n";
  }
  return g;
}

// Compute time of the busiest rank: an equal share of the step's FLOPs at
// the probed rate, stretched by the pipeline's ideal bubble. Communication
// is not modelled (its bytes are printed instead).
double step_time_s(const JobSpec& spec, const pl::MemoryPlan& plan, double gflops) {
  if (gflops <= 0) return 0;
  double bubble = 0;
  if (spec.parallel.pp > 1) {
    bubble = pl::pipeline::ideal_bubble(pl::pipeline::plan_spec_from(spec));
  }
  return plan.flops_per_step / spec.world() / (gflops * 1e9) / (1.0 - bubble);
}

std::string plan_json(const JobSpec& spec, const pl::MemoryPlan& plan, const rendezvous::Placement& placement,
                      double gflops) {
  const pl::ParamCount count = pl::param_count(spec.model);
  std::string out = fmt::format("{{\n  \"world\": {},\n  \"kind\": \"{}\",\n  \"params\": {:.0f},\n"
                                "  \"expert_params\": {:.0f},\n  \"flops_per_token\": {:.6g},\n  \"ranks\": [\n",
                                spec.world(), spec.model.kind, count.total(), count.experts,
                                pl::flops_per_token(spec.model));
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const auto& r = plan.ranks[i];
    out += fmt::format(
        "    {{\"rank\": {}, \"dp\": {}, \"tp\": {}, \"pp\": {}, {}\"param_bytes\": {}, \"grad_bytes\": {}, "
        "\"optimizer_bytes\": {}, \"offload_bytes\": {}, \"cache_bytes\": {}, \"activation_bytes\": {}, \"transient_bytes\": {}, "
        "\"peak_bytes\": {}, \"in_flight\": {}, \"build_bytes\": {}, \"data_bytes\": {}, \"need_bytes\": {}}}{}\n",
        r.rank, r.dp, r.tp, r.pp, spec.parallel.cp > 1 ? fmt::format("\"cp\": {}, ", r.cp) : std::string(), r.param_bytes, r.grad_bytes, r.optimizer_bytes, r.offload_bytes, r.cache_bytes, r.activation_bytes,
        r.transient_bytes, r.peak_bytes, r.in_flight, r.build_bytes, r.data_bytes, r.need_bytes(),
        i + 1 < plan.ranks.size() ? "," : "");
  }
  out += "  ],\n  \"max_peak_bytes\": " + std::to_string(plan.max_peak_bytes()) + ",\n";
  out += "  \"max_need_bytes\": " + std::to_string(plan.max_need_bytes()) + ",\n";
  out += fmt::format("  \"flops_per_step\": {:.6g},\n  \"matmul_gflops\": {:.4g},\n  \"step_time_s\": {:.6g},\n"
                     "  \"groups\": [\n",
                     plan.flops_per_step, gflops, step_time_s(spec, plan, gflops));
  for (size_t i = 0; i < placement.groups.size(); ++i) {
    const auto& g = placement.groups[i];
    std::string ranks;
    for (size_t k = 0; k < g.ranks.size(); ++k) ranks += (k ? ", " : "") + std::to_string(g.ranks[k]);
    out += fmt::format("    {{\"axis\": \"{}\", \"ranks\": [{}], \"link\": \"{}\", \"bytes_per_step\": {}}}{}\n",
                       g.axis, ranks, rendezvous::link_tier_name(g.tier), g.bytes_per_step,
                       i + 1 < placement.groups.size() ? "," : "");
  }
  return out + "  ]\n}\n";
}

std::string plan_text(const JobSpec& spec, const pl::MemoryPlan& plan, const rendezvous::Placement& placement,
                      double gflops) {
  std::string out = job_spec_summary(spec) + "\n";
  const ModelSpec& m = spec.model;
  const pl::ParamCount count = pl::param_count(m);
  const std::string llama =
      pl::is_llama(m) ? fmt::format(", kv_heads {}, ffn_hidden {}{}", m.effective_kv_heads(), m.effective_ffn_hidden(),
                                    m.tie_embeddings ? ", tied embeddings" : "")
                      : std::string();
  const std::string moe = m.moe.experts > 0 ? fmt::format(", {} experts (top {}, d_ff {}) every {} block(s)",
                                                          m.moe.experts, m.moe.top_k, pl::expert_hidden(m), m.moe.every)
                                            : std::string();
  out += fmt::format("model {}: layers {}, d_model {}, heads {}{}, seq_len {}, vocab {}{}; attention {}, recompute {}, "
                     "dropout {}, precision {}\n",
                     m.kind, m.layers, m.d_model, m.heads, llama, m.seq_len, m.vocab, moe, to_string(m.attention),
                     to_string(spec.train.recompute), m.dropout, to_string(spec.train.precision));
  out += fmt::format("parameters: {:.0f} ({:.3g}{}); {:.4g} FLOPs per token (6N + 12 L d_model seq_len)\n\n",
                     count.total(), count.total(),
                     count.experts > 0 ? fmt::format(", {:.0f} in experts", count.experts) : std::string(),
                     pl::flops_per_token(m));
  out += pl::plan_to_text(spec, plan);
  out += fmt::format("\npeak of the largest rank: {}; FLOPs per step: {:.3e} (forward + backward + recompute)\n",
                     pl::format_bytes(double(plan.max_peak_bytes())), plan.flops_per_step);
  if (gflops > 0)
    out += fmt::format("step time estimate: {:.4f} s (compute only, at {:.1f} GFLOP/s per rank measured by "
                       "dtrain-worker probe-matmul, with the pipeline's ideal bubble)\n",
                       step_time_s(spec, plan, gflops), gflops);
  out += "\ncommunication per step (as dtrain topo):\n";
  for (const auto& g : placement.groups) {
    if (g.ranks.size() < 2) continue;
    std::string ranks;
    for (size_t k = 0; k < g.ranks.size(); ++k) ranks += (k ? "," : "") + std::to_string(g.ranks[k]);
    out += fmt::format("  {:<3} [{}] over {}: {}\n", g.axis, ranks, rendezvous::link_tier_name(g.tier),
                       pl::format_bytes(double(g.bytes_per_step)));
  }
  out += "\nfp32 figures (bf16 autocast keeps some activations in 2 bytes: an upper bound); activations "
         "are autograd's saved tensors, transient backward's largest temporaries; data the bytes dataset's "
         "host copy; need = the peak (or the model as built, when larger) + data, what `launch` checks.\n";
  return out;
}

void run_plan(const PlanOptions& o) {
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(o.spec, o.sets, &warnings);
  pl::check_model_size(spec);
  int64_t budget = 0;
  if (!o.memory_per_rank.empty()) {
    budget = parse_byte_size(o.memory_per_rank);
    if (budget <= 0)
      throw Error(ErrorCode::config, "--memory-per-rank " + o.memory_per_rank + " is not a size",
                  "write e.g. 80GiB, 512MiB or a byte count");
  }
  const pl::MemoryPlan plan = pl::plan_memory(spec);
  const rendezvous::Placement placement = rendezvous::place_job(spec, true, warnings);
  const double gflops = o.probe ? matmul_gflops() : 0.0;
  if (o.format == "json")
    std::cout << plan_json(spec, plan, placement, gflops);
  else
    std::cout << plan_text(spec, plan, placement, gflops);
  if (o.suggest) {
    if (o.world < 1) throw Error(ErrorCode::config, "--suggest needs --world N (the ranks to lay out)");
    const int64_t spec_budget =
        spec.cluster.memory_per_rank.empty() ? 0 : parse_byte_size(spec.cluster.memory_per_rank);
    print_suggestions(spec, {o.world, budget > 0 ? budget : spec_budget, gflops}, std::cout);
    return;
  }
  check_memory_budget(spec, {budget, false});
}

void add_plan(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict every rank's memory (params, grads, optimizer, activations, peak), FLOPs and traffic");
  cmd->add_option("spec", opts->spec, "Job spec (YAML)")->required();
  cmd->add_option("--set", opts->sets, "Override a spec field: key.path=value (value read as YAML)");
  cmd->add_option("--format", opts->format, "Output format")->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--memory-per-rank", opts->memory_per_rank,
                  "Refuse a plan whose peak exceeds this per rank (e.g. 80GiB; default cluster.memory_per_rank)");
  cmd->add_flag("!--no-probe", opts->probe, "Skip the matmul probe (no step-time estimate)");
  cmd->add_flag("--suggest", opts->suggest, "Rank the meshes of --world ranks that fit the memory budget");
  cmd->add_option("--world", opts->world, "Ranks to lay out for --suggest")->check(CLI::Range(1, 1 << 16));
  cmd->callback([opts, &exit_code] {
    run_plan(*opts);
    exit_code = 0;
  });
}

}  // namespace
}  // namespace dtrain::app

DTRAIN_REGISTER_COMMAND(25, dtrain::app::add_plan);
