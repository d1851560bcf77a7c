// parallel.dp: auto and train.grad_accum: auto (spec_resolve.h): settled from
// the spec's cluster when it loads (before validate_spec, which then checks
// the numbers like any others) and from a round's nodes by spec_for_round.
// Elastic ranges are checked at their largest size (an error) and at every
// smaller one (a warning: the rendezvous refuses such a round when it forms).
#include "common/spec_resolve.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "common/spec_detail.h"

namespace dtrain {
namespace {

std::string str(long long v) { return std::to_string(v); }

// The world of `nodes` nodes over tp x pp; 0 when it does not divide.
int dp_of(int nodes, int ppn, int tp, int pp) {
  const long long slots = 1LL * nodes * ppn, per = 1LL * tp * pp;
  return per > 0 && slots % per == 0 ? int(slots / per) : 0;
}

}  // namespace

int auto_grad_accum(int global_batch, int micro_batch, int dp, std::string* why) {
  const long long per_step = 1LL * micro_batch * dp;
  if (per_step > 0 && global_batch > 0 && global_batch % per_step == 0)
    return int(global_batch / per_step);
  if (why) {
    const long long lo = per_step > 0 ? global_batch / per_step * per_step : 0;
    std::string multiples = lo > 0 ? str(lo) + " or " + str(lo + per_step) : str(per_step);
    *why = "train.grad_accum = auto: train.global_batch(" + str(global_batch) +
           ") is not a multiple of train.micro_batch(" + str(micro_batch) + ") x parallel.dp(" +
           str(dp) + ") = " + str(per_step) + "; use train.global_batch " + multiples +
           " (multiples of " + str(per_step) + "), or another train.micro_batch";
  }
  return 0;
}

JobSpec spec_for_round(const JobSpec& spec, int nodes, int dp) {
  JobSpec r = spec;
  r.cluster.nodes_min = r.cluster.nodes_max = nodes;
  r.parallel.dp = dp;
  r.parallel.dp_auto = false;
  const std::string round = "a round of " + str(nodes) + " node(s) (dp " + str(dp) + ")";
  if (spec.train.grad_accum_auto) {
    std::string why;
    r.train.grad_accum = auto_grad_accum(spec.train.global_batch, spec.train.micro_batch, dp, &why);
    if (r.train.grad_accum == 0)
      throw Error(ErrorCode::config, spec.source + ": " + round + ": " + why,
                  "choose a train.global_batch that every elastic size divides");
    r.train.grad_accum_auto = false;
  } else if (spec.train.global_batch > 0 && r.global_batch() != spec.train.global_batch) {
    throw Error(ErrorCode::config,
                spec.source + ": " + round + ": train.micro_batch(" + str(r.train.micro_batch) +
                    ") x train.grad_accum(" + str(r.train.grad_accum) + ") x dp(" + str(dp) +
                    ") = " + str(r.global_batch()) + " != train.global_batch(" +
                    str(spec.train.global_batch) + ")",
                "set train.grad_accum: auto so that the global batch stays the same");
  }
  // A fault aimed at a rank this smaller round lacks (its node is gone)
  // injects nothing in it; the spec stays valid for the round's world.
  if (r.fault.active() && !r.fault.every_rank() && r.fault.rank >= r.world()) r.fault = FaultSpec{};
  return r;
}

std::string auto_sizes_text(const JobSpec& spec, const JobSpec& r) {
  std::string out;
  if (spec.parallel.dp_auto)
    out = "parallel.dp = auto -> " + str(r.parallel.dp) + " (world " + str(r.world()) +
          " / (tp " + str(r.parallel.tp) + " x pp " + str(r.parallel.pp) + "))";
  if (spec.train.grad_accum_auto)
    out += (out.empty() ? "" : ", ") + std::string("train.grad_accum = auto -> ") +
           str(r.train.grad_accum) + " (global_batch " + str(spec.train.global_batch) +
           " / (micro_batch " + str(r.train.micro_batch) + " x dp " + str(r.parallel.dp) + "))";
  return out;
}

namespace detail {

namespace {

bool cluster_known(const SpecOrigin& origin, const JobSpec& s) {
  const ClusterSpec& c = s.cluster;
  return !origin.any_bad({"cluster.nodes", "cluster.procs_per_node", "parallel.tp", "parallel.pp"}) &&
         c.nodes_min >= 1 && c.nodes_max >= c.nodes_min && c.procs_per_node >= 1 &&
         s.parallel.tp >= 1 && s.parallel.pp >= 1;
}

// parallel.dp: auto from the largest round (cluster.nodes' max).
void resolve_dp(SpecOrigin& origin, JobSpec& s, Problems& problems) {
  const ClusterSpec& c = s.cluster;
  ParallelSpec& p = s.parallel;
  p.dp = dp_of(c.nodes_max, c.procs_per_node, p.tp * std::max(1, p.cp), p.pp);
  if (p.dp > 0) return;
  const int per = p.tp * p.pp * std::max(1, p.cp);
  const long long slots = 1LL * c.nodes_max * c.procs_per_node;
  problems.error(origin.where("parallel.dp"),
                 "parallel.dp = auto: tp(" + str(p.tp) + ") x pp(" + str(p.pp) + ") = " + str(per) +
                     " does not divide the world cluster.nodes(" +
                     (c.nodes_min < c.nodes_max ? "max " : "") + str(c.nodes_max) +
                     ") x cluster.procs_per_node(" + str(c.procs_per_node) + ") = " + str(slots) +
                     "; use cluster.procs_per_node " + str(per / std::gcd(c.nodes_max, per)) +
                     " (or a multiple), or tp and pp whose product divides " + str(slots));
  origin.bad_fields.insert("parallel.dp");
}

// train.global_batch and train.grad_accum: auto at the resolved dp; false
// when a problem was reported.
bool resolve_grad_accum(SpecOrigin& origin, JobSpec& s, Problems& problems) {
  TrainSpec& t = s.train;
  const int dp = s.parallel.dp;
  if (t.global_batch < 0) {
    problems.error(origin.where("train.global_batch"),
                   "train.global_batch = " + str(t.global_batch) + ": must be >= 0; it counts "
                   "sequences per step (0 = micro_batch x grad_accum x dp)");
    origin.bad_fields.insert("train.global_batch");
    return false;
  }
  if (t.micro_batch < 1 || dp < 1) return false;  // reported by validate_spec
  if (t.grad_accum_auto && t.global_batch == 0) {
    problems.error(origin.where("train.grad_accum"),
                   "train.grad_accum = auto needs train.global_batch (sequences per step) to "
                   "derive it from; set train.global_batch, e.g. " +
                       str(1LL * t.micro_batch * dp) + ", or give grad_accum a number");
    origin.bad_fields.insert("train.grad_accum");
    return false;
  }
  if (t.grad_accum_auto) {
    std::string why;
    t.grad_accum = auto_grad_accum(t.global_batch, t.micro_batch, dp, &why);
    if (t.grad_accum > 0) return true;
    problems.error(origin.where("train.global_batch"), why);
    origin.bad_fields.insert("train.grad_accum");
    return false;
  }
  if (t.global_batch == 0 || s.global_batch() == t.global_batch) return true;
  problems.error(origin.where("train.global_batch"),
                 "train.global_batch = " + str(t.global_batch) + " but train.micro_batch(" +
                     str(t.micro_batch) + ") x train.grad_accum(" + str(t.grad_accum) +
                     ") x parallel.dp(" + str(dp) + ") = " + str(s.global_batch()) +
                     "; set train.grad_accum: auto to derive it, or drop train.global_batch");
  return false;
}

// The smaller rounds of an elastic range: the sizes the rendezvous would
// refuse, and a global batch that follows the nodes.
void warn_elastic_sizes(const JobSpec& s, Problems& problems) {
  const ClusterSpec& c = s.cluster;
  const TrainSpec& t = s.train;
  const std::string range = "cluster.nodes = " + str(c.nodes_min) + ":" + str(c.nodes_max);
  std::string refused;
  int listed = 0;
  for (int n = c.nodes_min; n < c.nodes_max; ++n) {
    const int dp = dp_of(n, c.procs_per_node, s.parallel.tp * std::max(1, s.parallel.cp), s.parallel.pp);
    const bool keeps = t.global_batch == 0 ||
                       (t.grad_accum_auto ? auto_grad_accum(t.global_batch, t.micro_batch, dp, nullptr) > 0
                                          : 1LL * t.micro_batch * t.grad_accum * dp == t.global_batch);
    if (dp > 0 && keeps) continue;
    if (++listed > 8) {
      refused += ", ...";
      break;
    }
    refused += (refused.empty() ? "" : ", ") + str(n) +
               (dp == 0 ? " (world not a multiple of tp x pp)" : " (dp " + str(dp) + ")");
  }
  if (!refused.empty())
    problems.warn(range + ": a round of " + refused + " node(s) cannot keep this mesh" +
                  (t.global_batch > 0 ? " and train.global_batch = " + str(t.global_batch) : "") +
                  " and would be refused when it forms");
  if (!t.grad_accum_auto && t.global_batch == 0)
    problems.warn(range + " with train.grad_accum = " + str(t.grad_accum) +
                  ": dp follows the nodes of each round, and so does the global batch "
                  "(micro_batch x grad_accum x dp); set train.global_batch and "
                  "train.grad_accum: auto to keep it, and the loss curve, across rounds");
}

}  // namespace

void resolve_auto_fields(SpecOrigin& origin, JobSpec& s, Problems& problems) {
  const bool cluster_ok = cluster_known(origin, s);
  if (s.parallel.dp_auto && cluster_ok) resolve_dp(origin, s, problems);
  if (origin.any_bad({"train.global_batch", "train.grad_accum", "train.micro_batch", "parallel.dp"}) ||
      !resolve_grad_accum(origin, s, problems))
    return;
  if (cluster_ok && s.cluster.nodes_min < s.cluster.nodes_max) warn_elastic_sizes(s, problems);
}

}  // namespace detail
}  // namespace dtrain
