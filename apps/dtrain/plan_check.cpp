// check_memory_budget (plan_check.h): the candidates are single changes of
// the spec that lower memory, cheapest first by what they cost (no extra
// compute or traffic, then more traffic, then recomputation, then smaller
// micro-batches, then a smaller model); the first whose predicted need fits
// is the suggestion.
#include "apps/dtrain/plan_check.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_size.h"
#include "common/error.h"
#include "common/machine_memory.h"
#include "plan/memory_plan.h"

namespace dtrain::app {
namespace {

namespace pl = dtrain::plan;

std::string fmt_value(int v) { return std::to_string(v); }
std::string fmt_value(const std::string& v) { return v; }

int64_t need_of(const JobSpec& spec) {
  try {
    return pl::plan_memory(spec).max_need_bytes();
  } catch (const Error&) {
    return -1;  // a layout the engine would refuse is no suggestion
  }
}

// The largest value v in [1, from) for which set(spec, v) fits, by
// bisection (memory grows with v; `from` itself does not fit); 0 when none does.
template <typename Set>
int largest_fitting(const JobSpec& spec, int from, int64_t budget, Set set) {
  auto fits = [&](int v) {
    JobSpec s = spec;
    set(s, v);
    const int64_t need = need_of(s);
    return need >= 0 && need <= budget;
  };
  if (from <= 1 || !fits(1)) return 0;
  int lo = 1, hi = from;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// (--set text, applied change) in order of cost.
std::vector<std::pair<std::string, JobSpec>> cheaper_layouts(const JobSpec& spec, int64_t budget) {
  std::vector<std::pair<std::string, JobSpec>> out;
  auto add = [&](const std::string& what, auto change) {
    JobSpec s = spec;
    change(s);
    out.emplace_back(what, s);
  };
  if (spec.model.attention == AttentionImpl::naive)
    add("model.attention=tiled", [](JobSpec& s) { s.model.attention = AttentionImpl::tiled; });
  for (int z = spec.parallel.zero + 1; z <= 3 && spec.parallel.dp > 1; ++z)
    if (!(z == 3 && spec.parallel.pp > 1))
      add("parallel.zero=" + std::to_string(z), [z](JobSpec& s) { s.parallel.zero = z; });
  if (spec.train.recompute == Recompute::none)
    add("train.recompute=selective", [](JobSpec& s) { s.train.recompute = Recompute::selective; });
  if (spec.train.recompute != Recompute::full)
    add("train.recompute=full", [](JobSpec& s) { s.train.recompute = Recompute::full; });
  // The largest divisor of micro_batch that fits, grad_accum scaled to keep the batch.
  const int mb = spec.train.micro_batch;
  for (int m = mb - 1; m >= 1 && mb > 1; --m) {
    if (mb % m != 0) continue;
    JobSpec s = spec;
    s.train.micro_batch = m, s.train.grad_accum *= mb / m;
    const int64_t need = need_of(s);
    if (need < 0 || need > budget) continue;
    out.emplace_back("train.micro_batch=" + std::to_string(m) + " --set train.grad_accum=" +
                         std::to_string(s.train.grad_accum), s);
    break;
  }
  // A smaller model (changes what is trained: last).
  const int ep = std::max(1, spec.parallel.ep), top_k = std::max(1, spec.model.moe.top_k);
  if (spec.model.moe.experts > ep) {
    const int units = largest_fitting(spec, spec.model.moe.experts / ep, budget,
                                      [ep](JobSpec& s, int v) { s.model.moe.experts = v * ep; });
    if (units * ep >= top_k)
      add("model.moe.experts=" + std::to_string(units * ep), [&](JobSpec& s) { s.model.moe.experts = units * ep; });
  }
  if (spec.model.seq_len > 1) {
    const int len = largest_fitting(spec, spec.model.seq_len, budget, [](JobSpec& s, int v) { s.model.seq_len = v; });
    if (len > 0) add("model.seq_len=" + std::to_string(len), [len](JobSpec& s) { s.model.seq_len = len; });
  }
  return out;
}

// The spec fields a part of the need grows with, as "field = value, ...".
std::string fields_of(const JobSpec& spec, const std::string& part) {
  const ModelSpec& m = spec.model;
  auto f = [](const std::string& name, auto v) { return name + " = " + fmt_value(v); };
  const std::string moe = m.moe.experts > 0 ? ", " + f("model.moe.experts", m.moe.experts) : "";
  if (part == "params + grads + optimizer" || part == "the build")
    return f("model.d_model", m.d_model) + ", " + f("model.layers", m.layers) + ", " + f("model.vocab", m.vocab) + moe;
  if (part == "cache") return f("model.seq_len", m.seq_len) + ", " + f("model.attention", to_string(m.attention));
  if (part == "data") return f("data.path", spec.data.path);
  return f("train.micro_batch", spec.train.micro_batch) + ", " + f("model.seq_len", m.seq_len) + ", " +
         f("model.d_model", m.d_model) + moe;
}

// "activations 39.8 GiB on rank 0 (train.micro_batch = ...)": the largest
// part of the rank with the largest need, and the fields it grows with.
std::string largest_part(const JobSpec& spec, const pl::MemoryPlan& plan) {
  const pl::RankMemory* worst = &plan.ranks.front();
  for (const auto& r : plan.ranks)
    if (r.need_bytes() > worst->need_bytes()) worst = &r;
  const pl::RankMemory& r = *worst;
  const std::vector<std::pair<std::string, int64_t>> parts = {
      {"params + grads + optimizer", r.static_bytes()},
      {"cache", r.cache_bytes},  // the naive attention's causal masks
      {"activations", r.activation_bytes},
      {"transient", r.transient_bytes},
      {"the build", r.build_bytes > r.peak_bytes ? r.build_bytes : 0},  // the rank's share, before ZeRO shards it
      {"data", r.data_bytes}};                                          // the bytes file's copy
  const auto it = std::max_element(parts.begin(), parts.end(),
                                   [](const auto& a, const auto& b) { return a.second < b.second; });
  return it->first + " " + pl::format_bytes(double(it->second)) + " on rank " + std::to_string(r.rank) + " (" +
         fields_of(spec, it->first) + ")";
}

}  // namespace

void check_memory_budget(const JobSpec& spec, BudgetSources sources) {
  int64_t budget = 0;
  std::string what;
  if (sources.flag > 0) {
    budget = sources.flag;
    what = "cluster.memory_per_rank = " + pl::format_bytes(double(budget));  // --memory-per-rank replaces it
  } else if (!spec.cluster.memory_per_rank.empty()) {
    budget = parse_byte_size(spec.cluster.memory_per_rank);
    what = "cluster.memory_per_rank = " + pl::format_bytes(double(budget));
  }
  const uint64_t machine = sources.machine && spec.cluster.device == DeviceKind::cpu ? machine_memory_bytes() : 0;
  const int procs = std::max(1, spec.cluster.procs_per_node);
  if (machine > 0 && (budget <= 0 || int64_t(machine / uint64_t(procs)) < budget)) {
    budget = int64_t(machine / uint64_t(procs));
    what = "this machine's memory, " + pl::format_bytes(double(machine)) + " for cluster.procs_per_node = " +
           std::to_string(procs) + " rank(s) (" + pl::format_bytes(double(budget)) + " each),";
  }
  if (budget <= 0) return;
  const pl::MemoryPlan plan = pl::plan_memory(spec);
  if (plan.max_need_bytes() <= budget) return;
  std::string fix = "no single change of attention, zero, recompute, micro_batch, experts or seq_len fits; add "
                    "ranks (dp, tp, pp or ep) or shrink the model";
  for (const auto& [change, s] : cheaper_layouts(spec, budget)) {
    const int64_t need = need_of(s);
    if (need >= 0 && need <= budget) {
      fix = "the cheapest change that fits: --set " + change + " (predicted peak " + pl::format_bytes(double(need)) +
            " per rank)";
      break;
    }
  }
  if (machine > 0) fix += "; --allow-large starts it anyway";
  throw Error(ErrorCode::config,
              what + " is below the predicted peak " + pl::format_bytes(double(plan.max_need_bytes())) +
                  " per rank (dtrain plan; largest part: " + largest_part(spec, plan) + "):\n" +
                  pl::plan_to_text(spec, plan),
              fix);
}

}  // namespace dtrain::app
