// The job spec's mixture-of-experts rules (model.moe and its relations to
// parallel.ep): ranges, the balance enum, experts % ep, top_k <= experts,
// the experts' hidden width.
// Problems are collected like the rest of validate_spec; nothing throws.
// What the engine can run with MoE (tp, pp) is the engine's check.
#include <string>

#include "common/spec_detail.h"

namespace dtrain::detail {

void validate_moe(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const MoeSpec& m = s.model.moe;
  const int ep = s.parallel.ep;
  auto bad = [&](std::initializer_list<std::string> paths) { return origin.any_bad(paths); };
  auto error = [&](const std::string& path, const std::string& text) { problems.error(origin.where(path), text); };
  const std::string E = std::to_string(m.experts);
  if (!bad({"model.moe.experts"}) && m.experts < 0)
    error("model.moe.experts", "model.moe.experts = " + E + ": must be >= 0; use 0 for a dense model");
  if (!bad({"model.moe.experts", "parallel.ep"}) && m.experts == 0 && ep > 1)
    error("model.moe.experts", "model.moe.experts = 0 (a dense model) with parallel.ep = " + std::to_string(ep) +
                                   ": expert parallelism needs experts to spread; set model.moe.experts to a "
                                   "multiple of " + std::to_string(ep) + " (e.g. " + std::to_string(2 * ep) +
                                   "), or use parallel.ep 1");
  if (!bad({"model.moe.experts", "parallel.ep"}) && m.experts > 0 && ep >= 1 && m.experts % ep != 0)
    error("model.moe.experts", "model.moe.experts = " + E + " is not divisible by parallel.ep = " +
                                   std::to_string(ep) + " (each EP rank holds experts / ep experts); use a "
                                   "multiple of " + std::to_string(ep) + " experts, or an ep dividing " + E);
  // Checked for a dense model too: an unknown name has no enum value to keep.
  check_enum_name(origin, problems, "model.moe.balance");
  if (m.experts <= 0 || bad({"model.moe.experts"})) {
    return;  // dense: the other moe fields are unused
  }
  if (!bad({"model.moe.top_k"}) && (m.top_k < 1 || m.top_k > m.experts))
    error("model.moe.top_k", "model.moe.top_k = " + std::to_string(m.top_k) + ": must be in [1, model.moe.experts = " +
                                 E + "]; use 1 (Switch) or 2 (GShard, Mixtral)");
  if (!bad({"model.moe.capacity_factor"}) && !(m.capacity_factor > 0.0))
    error("model.moe.capacity_factor", "model.moe.capacity_factor = " + format_double(m.capacity_factor) +
                                           ": must be > 0 (each expert takes ceil(tokens * top_k * "
                                           "capacity_factor / experts) tokens); e.g. 1.25");
  if (!bad({"model.moe.aux_loss_coef"}) && !(m.aux_loss_coef >= 0.0))
    error("model.moe.aux_loss_coef", "model.moe.aux_loss_coef = " + format_double(m.aux_loss_coef) +
                                         ": must be >= 0; e.g. 0.01, or 0 for no auxiliary loss");
  if (!bad({"model.moe.every"}) && m.every < 1)
    error("model.moe.every", "model.moe.every = " + std::to_string(m.every) +
                                 ": must be >= 1 (1: every block is MoE, 2: blocks 0, 2, 4, ...)");
  if (!bad({"model.moe.d_ff"}) && m.d_ff < 0)
    error("model.moe.d_ff", "model.moe.d_ff = " + std::to_string(m.d_ff) + ": must be >= 0 (0: 4 * model.d_model = " +
                                std::to_string(4 * s.model.d_model) + ", the dense MLP's width)");
  if (!bad({"model.moe.bias_rate"}) && !(m.bias_rate >= 0.0))
    error("model.moe.bias_rate", "model.moe.bias_rate = " + format_double(m.bias_rate) +
                                     ": must be >= 0; e.g. 0.001 (DeepSeek-V3's gamma)");
  if (m.balance != MoeBalance::bias && m.bias_rate != MoeSpec{}.bias_rate && !bad({"model.moe.bias_rate"}))
    problems.warn("model.moe.bias_rate = " + format_double(m.bias_rate) +
                  " is ignored: only model.moe.balance = bias uses it (balance = " + to_string(m.balance) + ")");
}

}  // namespace dtrain::detail
