// The job spec's Llama rules (model.kind llama and its fields): ranges,
// grouped-query attention (heads % kv_heads, kv heads over tp), rotary
// scaling, and the llama-only fields refused on a gpt.
// Problems are collected like the rest of validate_spec; nothing throws.
#include <string>
#include <utility>

#include "common/spec_detail.h"

namespace dtrain::detail {
void validate_llama(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const ModelSpec& m = s.model;
  auto bad = [&](std::initializer_list<std::string> paths) { return origin.any_bad(paths); };
  auto error = [&](const std::string& path, const std::string& text) { problems.error(origin.where(path), text); };
  const auto str = [](auto v) { return std::to_string(v); };
  if (m.kind != "llama") {
    const ModelSpec d;
    const auto& r = m.rope_scaling;
    const std::pair<const char*, bool> changed[] = {
        {"model.kv_heads", m.kv_heads != d.kv_heads},
        {"model.ffn_hidden", m.ffn_hidden != d.ffn_hidden},
        {"model.norm_eps", m.norm_eps != d.norm_eps},
        {"model.rope_theta", m.rope_theta != d.rope_theta},
        {"model.rope_scaling.factor", r.factor != d.rope_scaling.factor},
        {"model.rope_scaling.low_freq_factor", r.low_freq_factor != d.rope_scaling.low_freq_factor},
        {"model.rope_scaling.high_freq_factor", r.high_freq_factor != d.rope_scaling.high_freq_factor},
        {"model.rope_scaling.original_max_position",
         r.original_max_position != d.rope_scaling.original_max_position},
        {"model.tie_embeddings", m.tie_embeddings != d.tie_embeddings}};
    for (const auto& [path, is_set] : changed)
      if (is_set)
        error(path, std::string(path) + " is a field of model.kind llama (this model is " + m.kind +
                        "); set model.kind: llama, or remove " + path);
    return;
  }
  if (!bad({"model.kv_heads", "model.heads"}) && m.kv_heads != 0 &&
      (m.kv_heads < 1 || m.kv_heads > m.heads || (m.heads >= 1 && m.heads % m.kv_heads != 0)))
    error("model.kv_heads", "model.kv_heads = " + str(m.kv_heads) + " with model.heads = " + str(m.heads) +
                                ": kv_heads must be in [1, heads] and divide heads (each kv head serves heads / "
                                "kv_heads query heads); e.g. " + str(m.heads) + " (multi-head) or 1 (multi-query)");
  if (!bad({"model.ffn_hidden"}) && m.ffn_hidden < 0)
    error("model.ffn_hidden", "model.ffn_hidden = " + str(m.ffn_hidden) + ": must be >= 0 (0: 4 * model.d_model)");
  if (!bad({"model.norm_eps"}) && !(m.norm_eps > 0))
    error("model.norm_eps", "model.norm_eps = " + format_double(m.norm_eps) + ": must be > 0; e.g. 1.0e-5");
  if (!bad({"model.rope_theta"}) && !(m.rope_theta > 0))
    error("model.rope_theta", "model.rope_theta = " + format_double(m.rope_theta) +
                                  ": must be > 0; e.g. 10000 (Llama 2) or 500000 (Llama 3)");
  if (!bad({"model.d_model", "model.heads"}) && m.heads >= 1 && m.d_model % m.heads == 0 &&
      (m.d_model / m.heads) % 2 != 0)
    error("model.heads", "model.d_model / model.heads = " + str(m.d_model / m.heads) +
                             ": rotary positions need an even head dimension; choose heads so that d_model / heads "
                             "is even");
  const auto& r = m.rope_scaling;
  if (!bad({"model.rope_scaling.factor"}) && r.factor != 0 && !(r.factor >= 1))
    error("model.rope_scaling.factor", "model.rope_scaling.factor = " + format_double(r.factor) +
                                           ": must be >= 1 (Llama 3.1: 8), or 0 (no scaling)");
  if (r.factor > 0 && !bad({"model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor"}) &&
      !(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor))
    error("model.rope_scaling.high_freq_factor",
          "model.rope_scaling.low_freq_factor = " + format_double(r.low_freq_factor) + ", high_freq_factor = " +
              format_double(r.high_freq_factor) + ": need 0 < low_freq_factor < high_freq_factor (Llama 3.1: 1 and 4)");
  if (r.factor > 0 && !bad({"model.rope_scaling.original_max_position"}) && r.original_max_position < 1)
    error("model.rope_scaling.original_max_position",
          "model.rope_scaling.original_max_position = " + str(r.original_max_position) +
              ": must be >= 1 (Llama 3.1: 8192)");
  // Under tensor parallelism the kv heads split over tp (kv_heads % tp == 0)
  // or each tp rank holds whole copies of the kv heads its query heads use
  // (tp % kv_heads == 0); anything else would cut a kv head apart.
  const int kv = m.effective_kv_heads(), tp = s.parallel.tp;
  if (!bad({"model.kv_heads", "parallel.tp", "model.heads"}) && kv >= 1 && tp > 1 && kv % tp != 0 && tp % kv != 0)
    error("model.kv_heads", "model.kv_heads = " + str(kv) + " with parallel.tp = " + str(tp) +
                                ": the kv heads must split over tp (kv_heads % tp == 0) or be replicated "
                                "(tp % kv_heads == 0); choose a tp that divides or is a multiple of kv_heads");
  // The SwiGLU MLP's gate and up rows split over tp (column-parallel).
  const int f = m.effective_ffn_hidden();
  if (!bad({"model.ffn_hidden", "parallel.tp", "model.d_model"}) && tp > 1 && f % tp != 0)
    error("model.ffn_hidden", "model.ffn_hidden = " + str(f) + " is not divisible by parallel.tp = " + str(tp) +
                                  ": the MLP's hidden rows split over tp; choose a multiple of " + str(tp));
}

}  // namespace dtrain::detail
