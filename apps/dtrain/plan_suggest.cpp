// print_suggestions (plan_suggest.h). A candidate's step time is a model,
// not a measurement: compute = the step's FLOPs over the ranks at a matmul
// rate (this CPU's probed rate for a cpu cluster; an assumed 400 TFLOP/s a
// GPU, about 40% of an H100/H200's bf16 dense peak, for cuda), stretched by
// the pipeline's ideal bubble; plus communication without overlap: the
// busiest rank's bytes per step (the placement's groups, as `dtrain topo`
// shows them) over assumed link rates (NVLink 400 GB/s, InfiniBand 50 GB/s
// a GPU, PCIe 25 GB/s, loopback 10 GB/s). Good for ranking layouts against
// each other; it does not predict a run's seconds.
#include "apps/dtrain/plan_suggest.h"

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/mesh.h"
#include "plan/combinations.h"
#include "plan/flops.h"
#include "plan/memory_plan.h"
#include "plan/pipeline_plan.h"
#include "rendezvous/topology.h"

namespace dtrain::app {
namespace {

namespace pl = dtrain::plan;

constexpr double kGpuMatmulFlops = 400e12;

double link_bytes_per_s(rendezvous::LinkTier tier) {
  switch (tier) {
    case rendezvous::LinkTier::nvlink: return 400e9;
    case rendezvous::LinkTier::ib: return 50e9;
    case rendezvous::LinkTier::pcie: return 25e9;
    case rendezvous::LinkTier::loopback: return 10e9;
  }
  return 10e9;
}

struct Candidate {
  double compute_s = 0, comm_s = 0;
  int64_t need = 0, peak = 0, build = 0;  // the rank with the largest need
  std::string what;
  double time() const { return compute_s + comm_s; }
};

// The largest need of the spec's ranks: one rank per pipeline stage
// suffices (the tp, cp and ep ranks of a stage hold the same sizes, and
// ZeRO's first shard is never smaller than the others).
void largest_need(const JobSpec& spec, Candidate& out) {
  const mesh::Mesh m = spec.mesh();
  out.need = -1;
  for (int r = 0; r < spec.world(); ++r) {
    const mesh::Coord c = mesh::coord_of(m, r);
    if (c[mesh::Axis::dp] != 0 || c[mesh::Axis::tp] != 0 || c[mesh::Axis::cp] != 0 || c.ep != 0) continue;
    const pl::RankMemory rm = pl::plan_rank(spec, r);
    if (rm.need_bytes() > out.need) out.need = rm.need_bytes(), out.peak = rm.peak_bytes, out.build = rm.build_bytes;
  }
}

// The busiest rank's seconds of communication per step.
double comm_seconds(const rendezvous::Placement& placement, int world) {
  std::vector<double> per_rank(size_t(world), 0.0);
  for (const auto& g : placement.groups)
    for (int r : g.ranks) per_rank[size_t(r)] += double(g.bytes_per_step) / link_bytes_per_s(g.tier);
  return per_rank.empty() ? 0.0 : *std::max_element(per_rank.begin(), per_rank.end());
}

// The candidate's figures, or false when the builtin engine would refuse
// it (spec rules, combinations, a tp group across islands).
bool evaluate(const JobSpec& s, const SuggestOptions& o, Candidate& c) {
  try {
    std::vector<std::string> w;
    validate_job_spec(s, &w);
    if (!pl::combination_problems(s).empty()) return false;
    largest_need(s, c);
    const double rate = s.cluster.device == DeviceKind::cuda ? kGpuMatmulFlops
                        : o.gflops > 0                        ? o.gflops * 1e9
                                                              : 1e9;
    const double bubble = s.parallel.pp > 1 ? pl::pipeline::ideal_bubble(pl::pipeline::plan_spec_from(s)) : 0.0;
    c.compute_s = pl::flops_per_step(s) / s.world() / rate / (1.0 - bubble);
    c.comm_s = comm_seconds(rendezvous::place_job(s, false, {}), s.world());
    return true;
  } catch (const Error&) {
    return false;
  }
}

// ep sizes to try: 1 for a dense model; each divisor of the experts that
// divides dp x tp for a MoE one.
std::vector<int> ep_choices(const JobSpec& base, int dp, int tp) {
  const int experts = base.model.moe.experts;
  if (experts <= 0) return {1};
  std::vector<int> out;
  for (int ep = 1; ep <= experts; ++ep)
    if (experts % ep == 0 && (dp * tp) % ep == 0) out.push_back(ep);
  return out;
}

// The base spec on `world` ranks: its procs_per_node when that divides the
// world (nodes = world / procs_per_node), else one node of `world`.
JobSpec on_world(const JobSpec& base, int world) {
  JobSpec s = base;
  const int ppn = std::max(1, base.cluster.procs_per_node);
  s.cluster.procs_per_node = world % ppn == 0 ? ppn : world;
  s.cluster.nodes_min = s.cluster.nodes_max = world / s.cluster.procs_per_node;
  s.parallel.pipeline_virtual_stages = 1;
  s.parallel.pipeline_layers_per_stage.clear();
  if (s.parallel.pipeline_schedule == PipelineSchedule::interleaved_1f1b)
    s.parallel.pipeline_schedule = PipelineSchedule::one_f_one_b;
  return s;
}

std::vector<Candidate> candidates(const JobSpec& base, const SuggestOptions& o, Candidate& smallest) {
  std::vector<Candidate> fit;
  const int world = o.world, gbs = base.global_batch(), mb = base.train.micro_batch;
  smallest.need = -1;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp * tp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      const int dp = world / (tp * pp);
      if (gbs % (mb * dp) != 0) continue;
      for (int ep : ep_choices(base, dp, tp))
        for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)  // ZeRO shards over dp only
          for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
            JobSpec s = on_world(base, world);
            s.parallel.dp = dp, s.parallel.tp = tp, s.parallel.pp = pp, s.parallel.ep = ep, s.parallel.zero = zero;
            s.parallel.sequence_parallel = base.parallel.sequence_parallel && tp > 1;
            s.train.grad_accum = gbs / (mb * dp);
            s.train.recompute = rc;
            Candidate c;
            if (!evaluate(s, o, c)) continue;
            c.what = fmt::format("dp {} tp {} pp {}{} zero {} recompute {} (grad_accum {})", dp, tp, pp,
                                 base.model.moe.experts > 0 ? fmt::format(" ep {}", ep) : std::string(), zero,
                                 to_string(rc), s.train.grad_accum);
            if (smallest.need < 0 || c.need < smallest.need) smallest = c;
            if (o.budget <= 0 || c.need <= o.budget) fit.push_back(c);
          }
    }
  return fit;
}

}  // namespace

void print_suggestions(const JobSpec& base, const SuggestOptions& o, std::ostream& out) {
  Candidate smallest;
  std::vector<Candidate> rows = candidates(base, o, smallest);
  const std::string budget = o.budget > 0 ? " in " + pl::format_bytes(double(o.budget)) + " per rank" : std::string();
  if (rows.empty()) {
    if (smallest.need < 0)
      throw Error(ErrorCode::config,
                  fmt::format("--suggest --world {}: no mesh of {} ranks is one the builtin engine runs for {} "
                              "(global batch {} of micro_batch {})",
                              o.world, o.world, base.source, base.global_batch(), base.train.micro_batch),
                  "choose a --world whose dp divides the global batch, or change the spec");
    throw Error(ErrorCode::config,
                fmt::format("--suggest --world {}: no layout of {} fits{}; the smallest predicted need is {} "
                            "({}: peak {}, the model as built {}{})",
                            o.world, base.source, budget, pl::format_bytes(double(smallest.need)), smallest.what,
                            pl::format_bytes(double(smallest.peak)), pl::format_bytes(double(smallest.build)),
                            smallest.build > smallest.peak ? ", before ZeRO shards it" : ""),
                "raise --memory-per-rank (or cluster.memory_per_rank), lay out more ranks (--world), or shrink "
                "train.micro_batch, model.seq_len or the model");
  }
  std::sort(rows.begin(), rows.end(), [](const Candidate& a, const Candidate& b) {
    return a.time() != b.time() ? a.time() < b.time() : a.need < b.need;
  });
  const bool gpu = base.cluster.device == DeviceKind::cuda;
  out << fmt::format("\nlayouts of {} ranks that fit{}, by predicted step time ({} in all, the first 15):\n"
                     "(compute at {}, with the pipeline's ideal bubble, plus the busiest rank's bytes over its "
                     "links without overlap: a ranking, not a forecast)\n",
                     o.world, budget, rows.size(),
                     gpu ? "an assumed 400 TFLOP/s a GPU"
                         : o.gflops > 0 ? fmt::format("{:.1f} GFLOP/s a rank (probed)", o.gflops)
                                        : std::string("an assumed 1 GFLOP/s a rank (no probe)"));
  for (size_t i = 0; i < rows.size() && i < 15; ++i)
    out << fmt::format("  {:2}. {:<58} need {:>11}  step {:.4g} s (compute {:.4g}, comm {:.4g})\n", i + 1, rows[i].what,
                       pl::format_bytes(double(rows[i].need)), rows[i].time(), rows[i].compute_s, rows[i].comm_s);
}

}  // namespace dtrain::app
