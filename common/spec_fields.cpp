// The job spec's field table (every YAML key bound to its JobSpec member), the
// origin of each field for messages (file:line:col or --set), and small text
// helpers (did-you-mean, number formatting). No parsing or validation here.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/spec_detail.h"

namespace dtrain::detail {

#define DTRAIN_FIELD(path, member) \
  Field { path, [](JobSpec& s) -> FieldRef { return field_ref(&s.member); } }

const std::vector<Field>& spec_fields() {
  static const std::vector<Field> fields = {
      DTRAIN_FIELD("job.name", job.name),
      DTRAIN_FIELD("job.seed", job.seed),
      Field{"cluster.nodes",
            [](JobSpec& s) -> FieldRef {
              return NodesRef{&s.cluster.nodes_min, &s.cluster.nodes_max};
            }},
      DTRAIN_FIELD("cluster.procs_per_node", cluster.procs_per_node),
      DTRAIN_FIELD("cluster.device", cluster.device),
      DTRAIN_FIELD("cluster.backend", cluster.backend),
      DTRAIN_FIELD("cluster.shm", cluster.shm),
      DTRAIN_FIELD("cluster.hier_allreduce", cluster.hier_allreduce),
      DTRAIN_FIELD("cluster.gloo_reduce_scatter", cluster.gloo_reduce_scatter),
      DTRAIN_FIELD("cluster.max_restarts", cluster.max_restarts),
      DTRAIN_FIELD("cluster.warm_spares", cluster.warm_spares),
      DTRAIN_FIELD("cluster.recover_in_place", cluster.recover_in_place),
      DTRAIN_FIELD("cluster.live_recovery", cluster.live_recovery),
      DTRAIN_FIELD("cluster.grace_s", cluster.grace_s),
      DTRAIN_FIELD("cluster.hang_timeout_s", cluster.hang_timeout_s),
      DTRAIN_FIELD("cluster.hang_timeout_steps", cluster.hang_timeout_steps),
      DTRAIN_FIELD("cluster.memory_per_rank", cluster.memory_per_rank),
      DTRAIN_FIELD("cluster.rendezvous.endpoint", cluster.rendezvous.endpoint),
      DTRAIN_FIELD("cluster.rendezvous.join_timeout_s", cluster.rendezvous.join_timeout_s),
      DTRAIN_FIELD("cluster.rendezvous.last_call_s", cluster.rendezvous.last_call_s),
      DTRAIN_FIELD("cluster.rendezvous.heartbeat_s", cluster.rendezvous.heartbeat_s),
      DTRAIN_FIELD("cluster.rendezvous.rejoin_timeout_s", cluster.rendezvous.rejoin_timeout_s),
      DTRAIN_FIELD("cluster.rendezvous.token_file", cluster.rendezvous.token_file),
      DTRAIN_FIELD("cluster.rendezvous.advertise_addr", cluster.rendezvous.advertise_addr),
      DTRAIN_FIELD("cluster.rendezvous.tls.ca", cluster.rendezvous.tls_ca),
      DTRAIN_FIELD("cluster.rendezvous.tls.cert", cluster.rendezvous.tls_cert),
      DTRAIN_FIELD("cluster.rendezvous.tls.key", cluster.rendezvous.tls_key),
      DTRAIN_FIELD("cluster.topology.nvlink_domain", cluster.topology.nvlink_domain),
      DTRAIN_FIELD("cluster.topology.allow_slow", cluster.topology.allow_slow),
      Field{"parallel.dp",
            [](JobSpec& s) -> FieldRef { return AutoIntRef{&s.parallel.dp, &s.parallel.dp_auto}; }},
      DTRAIN_FIELD("parallel.tp", parallel.tp),
      DTRAIN_FIELD("parallel.pp", parallel.pp),
      DTRAIN_FIELD("parallel.ep", parallel.ep),
      DTRAIN_FIELD("parallel.cp", parallel.cp),
      DTRAIN_FIELD("parallel.order", parallel.order),
      DTRAIN_FIELD("parallel.zero", parallel.zero),
      DTRAIN_FIELD("parallel.pipeline.schedule", parallel.pipeline_schedule),
      DTRAIN_FIELD("parallel.pipeline.virtual_stages", parallel.pipeline_virtual_stages),
      DTRAIN_FIELD("parallel.pipeline.layers_per_stage", parallel.pipeline_layers_per_stage),
      DTRAIN_FIELD("parallel.ddp.bucket_mb", parallel.ddp_bucket_mb),
      DTRAIN_FIELD("parallel.ddp.overlap", parallel.ddp_overlap),
      DTRAIN_FIELD("parallel.fsdp.reshard_after_forward", parallel.fsdp_reshard_after_forward),
      DTRAIN_FIELD("parallel.fsdp.prefetch", parallel.fsdp_prefetch),
      DTRAIN_FIELD("parallel.fsdp.shared_params", parallel.fsdp_shared_params),
      DTRAIN_FIELD("parallel.sequence_parallel", parallel.sequence_parallel),
      DTRAIN_FIELD("parallel.reduce_dtype", parallel.reduce_dtype),
      DTRAIN_FIELD("model.kind", model.kind),
      DTRAIN_FIELD("model.vocab", model.vocab),
      DTRAIN_FIELD("model.layers", model.layers),
      DTRAIN_FIELD("model.d_model", model.d_model),
      DTRAIN_FIELD("model.heads", model.heads),
      DTRAIN_FIELD("model.seq_len", model.seq_len),
      DTRAIN_FIELD("model.dropout", model.dropout),
      DTRAIN_FIELD("model.tp_vocab", model.tp_vocab),
      DTRAIN_FIELD("model.moe.experts", model.moe.experts),
      DTRAIN_FIELD("model.moe.top_k", model.moe.top_k),
      DTRAIN_FIELD("model.moe.capacity_factor", model.moe.capacity_factor),
      DTRAIN_FIELD("model.moe.aux_loss_coef", model.moe.aux_loss_coef),
      DTRAIN_FIELD("model.moe.every", model.moe.every),
      DTRAIN_FIELD("model.moe.balance", model.moe.balance),
      DTRAIN_FIELD("model.moe.bias_rate", model.moe.bias_rate),
      DTRAIN_FIELD("model.moe.d_ff", model.moe.d_ff),
      DTRAIN_FIELD("model.attention", model.attention),
      DTRAIN_FIELD("model.kv_heads", model.kv_heads),
      DTRAIN_FIELD("model.ffn_hidden", model.ffn_hidden),
      DTRAIN_FIELD("model.norm_eps", model.norm_eps),
      DTRAIN_FIELD("model.rope_theta", model.rope_theta),
      DTRAIN_FIELD("model.rope_scaling.factor", model.rope_scaling.factor),
      DTRAIN_FIELD("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor),
      DTRAIN_FIELD("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor),
      DTRAIN_FIELD("model.rope_scaling.original_max_position", model.rope_scaling.original_max_position),
      DTRAIN_FIELD("model.tie_embeddings", model.tie_embeddings),
      DTRAIN_FIELD("train.steps", train.steps),
      DTRAIN_FIELD("train.micro_batch", train.micro_batch),
      Field{"train.grad_accum",
            [](JobSpec& s) -> FieldRef {
              return AutoIntRef{&s.train.grad_accum, &s.train.grad_accum_auto};
            }},
      DTRAIN_FIELD("train.global_batch", train.global_batch),
      DTRAIN_FIELD("train.lr", train.lr),
      DTRAIN_FIELD("train.min_lr", train.min_lr),
      DTRAIN_FIELD("train.warmup_steps", train.warmup_steps),
      DTRAIN_FIELD("train.weight_decay", train.weight_decay),
      DTRAIN_FIELD("train.beta1", train.beta1),
      DTRAIN_FIELD("train.beta2", train.beta2),
      DTRAIN_FIELD("train.adam_eps", train.adam_eps),
      DTRAIN_FIELD("train.grad_clip", train.grad_clip),
      DTRAIN_FIELD("train.precision", train.precision),
      DTRAIN_FIELD("train.recompute", train.recompute),
      DTRAIN_FIELD("train.nonfinite", train.nonfinite),
      DTRAIN_FIELD("train.nonfinite_patience", train.nonfinite_patience),
      DTRAIN_FIELD("train.init_from", train.init_from),
      DTRAIN_FIELD("train.offload.optimizer", train.offload.optimizer),
      DTRAIN_FIELD("train.offload.params", train.offload.params),
      DTRAIN_FIELD("train.offload.path", train.offload.path),
      DTRAIN_FIELD("train.offload.prefetch", train.offload.prefetch),
      DTRAIN_FIELD("train.offload.bucket_mb", train.offload.bucket_mb),
      DTRAIN_FIELD("data.path", data.path),
      DTRAIN_FIELD("data.format", data.format),
      DTRAIN_FIELD("data.blend", data.blend),
      DTRAIN_FIELD("data.valid.path", data.valid.path),
      DTRAIN_FIELD("data.valid.split", data.valid.split),
      DTRAIN_FIELD("data.valid.blend", data.valid.blend),
      DTRAIN_FIELD("data.valid.every", data.valid.every),
      DTRAIN_FIELD("data.valid.batches", data.valid.batches),
      DTRAIN_FIELD("checkpoint.dir", checkpoint.dir),
      DTRAIN_FIELD("checkpoint.every", checkpoint.every),
      DTRAIN_FIELD("checkpoint.keep", checkpoint.keep),
      DTRAIN_FIELD("checkpoint.async", checkpoint.async),
      DTRAIN_FIELD("checkpoint.memory.every", checkpoint.memory_every),
      DTRAIN_FIELD("checkpoint.memory.replicas", checkpoint.memory_replicas),
      DTRAIN_FIELD("log.dir", log.dir),
      DTRAIN_FIELD("log.every", log.every),
      DTRAIN_FIELD("log.tensorboard", log.tensorboard),
      DTRAIN_FIELD("log.live_peak", log.live_peak),
      DTRAIN_FIELD("log.trace.steps", log.trace_steps),
      DTRAIN_FIELD("fault.kind", fault.kind),
      DTRAIN_FIELD("fault.rank", fault.rank),
      DTRAIN_FIELD("fault.step", fault.step),
      DTRAIN_FIELD("fault.ms", fault.ms),
      DTRAIN_FIELD("entrypoint", entrypoint),
  };
  return fields;
}

#undef DTRAIN_FIELD

const std::set<std::string>& spec_sections() {
  static const std::set<std::string> sections = [] {
    std::set<std::string> out;
    for (const auto& f : spec_fields()) {
      std::string p = f.path;
      for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1))
        out.insert(p.substr(0, dot));
    }
    return out;
  }();
  return sections;
}

bool is_spec_field(const std::string& path) {
  for (const auto& f : spec_fields())
    if (path == f.path) return true;
  return false;
}

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = path.find('.');; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string mark_text(const std::string& source, const YAML::Mark& m) {
  std::string file = source.empty() ? "<spec>" : source;
  if (m.is_null() || m.line < 0) return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

}  // namespace

namespace {

// The --set that changed `path` or a section above it, or "".
std::string override_of(const SpecOrigin& o, std::string path) {
  for (;;) {
    auto it = o.overridden.find(path);
    if (it != o.overridden.end()) return it->second;
    size_t dot = path.rfind('.');
    if (dot == std::string::npos) return "";
    path.resize(dot);
  }
}

// The deepest node present along `path`; *complete says whether all of it was.
YAML::Mark deepest_mark(const YAML::Node& root, const std::string& path, bool* complete) {
  YAML::Mark mark = YAML::Mark::null_mark();
  YAML::Node cur = root;
  *complete = false;
  for (const auto& part : split_path(path)) {
    if (!cur || !cur.IsMap()) return mark;
    const YAML::Node& c = cur;
    YAML::Node next = c[part];
    if (!next) return mark;
    mark = next.Mark();
    cur.reset(next);  // rebind; operator= would overwrite the parent
  }
  *complete = true;
  return mark;
}

}  // namespace

std::string SpecOrigin::where(const std::string& path) const {
  std::string o = override_of(*this, path);
  if (!o.empty()) return o;
  bool complete = false;
  return mark_text(source, deepest_mark(root, path, &complete));
}

std::string SpecOrigin::where_any(const std::vector<std::string>& paths) const {
  for (const auto& p : paths) {
    std::string o = override_of(*this, p);
    if (!o.empty()) return o;
  }
  for (const auto& p : paths) {
    bool complete = false;
    YAML::Mark m = deepest_mark(root, p, &complete);
    if (complete) return mark_text(source, m);
  }
  return paths.empty() ? mark_text(source, YAML::Mark::null_mark()) : where(paths.front());
}

bool SpecOrigin::any_bad(const std::vector<std::string>& paths) const {
  for (const auto& p : paths)
    if (bad_fields.count(p)) return true;
  return false;
}

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of two neighbours each cost 1 ("stpes" is 1 from "steps").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix) {
  // Close enough: a third of the word's letters may differ (at least 1, at most 3).
  size_t limit = std::min<size_t>(3, std::max<size_t>(1, word.size() / 3));
  size_t best = limit + 1;
  std::string best_word;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best) {
      best = d;
      best_word = c;
    }
  }
  if (best_word.empty()) return "";
  return " (did you mean " + (prefix.empty() ? "" : prefix + ".") + best_word + "?)";
}

std::string format_double(double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // Keep it a float when read back by eye ("1" -> "1.0").
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string join_choices(const std::vector<int>& values, const std::string& last_sep) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += (i + 1 == values.size()) ? last_sep : ", ";
    out += std::to_string(values[i]);
  }
  return out;
}

}  // namespace dtrain::detail
