// Rules of the job spec (docs/ARCHITECTURE.md, 'The job spec'): ranges, enums,
// and the relations between fields (mesh = cluster size, heads % tp,
// layers % pp, ...). Every problem is collected with its origin, the value and
// the fix; nothing throws. Poor but legal choices become warnings.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/byte_size.h"
#include "common/spec_detail.h"

namespace dtrain::detail {
namespace {

std::string str(int v) { return std::to_string(v); }
std::string str(double v) { return format_double(v); }

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// "PATH = VALUE: must be A, B or C (did you mean B?)"
std::string not_one_of(const std::string& path, const std::string& value,
                       const std::vector<std::string>& choices) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i)
    list += (i ? (i + 1 == choices.size() ? " or " : ", ") : "") + choices[i];
  return path + " = " + (value.empty() ? "\"\"" : value) + ": must be " + list + did_you_mean(value, choices);
}

struct Checker {
  const JobSpec& spec;
  const SpecOrigin& origin;
  Problems& problems;

  bool bad(const std::vector<std::string>& paths) const { return origin.any_bad(paths); }
  void error(const std::string& path, const std::string& text) const {
    problems.error(origin.where(path), text);
  }

  template <typename T>
  void at_least(const std::string& path, T value, T min, const std::string& fix) const {
    if (bad({path}) || value >= min) return;
    error(path, path + " = " + str(value) + ": must be >= " + str(min) + "; " + fix);
  }
  void below_one(const std::string& path, double value) const {
    if (bad({path}) || (value >= 0.0 && value < 1.0)) return;
    error(path, path + " = " + str(value) + ": must be in [0, 1); e.g. 0.9");
  }
  void one_of(const std::string& path, const std::string& value,
              const std::vector<std::string>& choices) const {
    if (bad({path})) return;
    for (const auto& choice : choices)
      if (value == choice) return;
    error(path, not_one_of(path, value, choices));
  }
  // An enum field: its text was read against its names when it was converted.
  void one_of(const std::string& path) const { check_enum_name(origin, problems, path); }
};

// checkpoint.memory: `every` is a step count, 0 = no copies (the default, and
// what a printed spec of a run without copies holds); copies need a second node.
void check_memory_copies(const Checker& c) {
  const CheckpointSpec& k = c.spec.checkpoint;
  if (!c.bad({"checkpoint.memory.every"}) && k.memory_every < 0)
    c.error("checkpoint.memory.every", "checkpoint.memory.every = " + str(k.memory_every) +
                                           ": must be >= 1 (steps between in-memory copies), or 0 to keep "
                                           "no copies in memory");
  c.at_least("checkpoint.memory.replicas", k.memory_replicas, 0, "use 1 for one copy on another node, 0 for none");
  if (k.memory_every > 0 && k.memory_replicas > 0 && c.spec.cluster.nodes_max == 1)
    c.problems.warn("checkpoint.memory.replicas = " + str(k.memory_replicas) +
                    " is ignored on a single node (cluster.nodes = 1): no other node can hold a copy, so "
                    "restarts read checkpoint.dir only");
}

void check_ranges(const Checker& c) {
  const JobSpec& s = c.spec;
  const char* size_fix = "sizes are counts, use a positive number";
  if (!c.bad({"job.name"}) && s.job.name.empty())
    c.error("job.name", "job.name is empty; name the job, e.g. name: gpt-3d");
  c.at_least("cluster.nodes", s.cluster.nodes_min, 1, "use nodes: 1 on one machine");
  if (!c.bad({"cluster.nodes"}) && s.cluster.nodes_max < s.cluster.nodes_min)
    c.error("cluster.nodes", "cluster.nodes = " + str(s.cluster.nodes_min) + ":" +
                                 str(s.cluster.nodes_max) + ": the elastic range is MIN:MAX with "
                                 "MIN <= MAX; e.g. \"1:4\"");
  c.at_least("cluster.procs_per_node", s.cluster.procs_per_node, 1, size_fix);
  c.at_least("cluster.max_restarts", s.cluster.max_restarts, 0, "use 0 to never restart");
  c.at_least("cluster.grace_s", s.cluster.grace_s, 0.0, "seconds between SIGTERM and SIGKILL");
  c.at_least("cluster.hang_timeout_s", s.cluster.hang_timeout_s, 0.0,
             "seconds without any collective completing, e.g. 300; 0 turns hang detection off");
  c.at_least("cluster.hang_timeout_steps", s.cluster.hang_timeout_steps, 0.0,
             "a number of steps, e.g. 5 (it shortens cluster.hang_timeout_s); 0 = off");
  if (s.cluster.hang_timeout_steps > 0 && s.cluster.hang_timeout_s <= 0)
    c.error("cluster.hang_timeout_steps", "cluster.hang_timeout_steps = " + str(s.cluster.hang_timeout_steps) +
                                              " needs cluster.hang_timeout_s > 0 (its upper bound, and the bound "
                                              "until every rank has timed a step); e.g. hang_timeout_s: 300");
  c.at_least("cluster.rendezvous.join_timeout_s", s.cluster.rendezvous.join_timeout_s, 1,
             "seconds an agent waits for the round, e.g. 60");
  c.at_least("cluster.rendezvous.last_call_s", s.cluster.rendezvous.last_call_s, 0.0,
             "seconds to wait for more nodes after the minimum joined");
  c.at_least("cluster.rendezvous.heartbeat_s", s.cluster.rendezvous.heartbeat_s, 0.001,
             "a positive interval in seconds, e.g. 2");
  c.at_least("cluster.rendezvous.rejoin_timeout_s", s.cluster.rendezvous.rejoin_timeout_s, 0.0,
             "seconds an agent keeps re-joining after losing the rendezvous, e.g. 300; 0 = give up at once");
  c.at_least("cluster.topology.nvlink_domain", s.cluster.topology.nvlink_domain, 0,
             "use 0 for the whole node (or discovered)");
  for (auto [path, v] : {std::pair{"parallel.dp", s.parallel.dp}, {"parallel.tp", s.parallel.tp},
                         {"parallel.pp", s.parallel.pp}, {"parallel.ep", s.parallel.ep}})
    c.at_least<int>(path, v, 1, "use 1 to not split along this axis");
  c.at_least("parallel.ddp.bucket_mb", s.parallel.ddp_bucket_mb, 0.001,
             "a positive size in MB, e.g. 25");
  for (auto [path, v] : {std::pair{"model.vocab", s.model.vocab}, {"model.layers", s.model.layers},
                         {"model.d_model", s.model.d_model}, {"model.heads", s.model.heads},
                         {"model.seq_len", s.model.seq_len}, {"train.steps", s.train.steps},
                         {"train.micro_batch", s.train.micro_batch},
                         {"train.grad_accum", s.train.grad_accum}, {"log.every", s.log.every},
                         {"checkpoint.keep", s.checkpoint.keep}})
    c.at_least<int>(path, v, 1, size_fix);
  c.below_one("model.dropout", s.model.dropout);
  c.below_one("train.beta1", s.train.beta1);
  c.below_one("train.beta2", s.train.beta2);
  c.at_least("train.adam_eps", s.train.adam_eps, 1e-30, "a small positive number, e.g. 1.0e-8");
  c.at_least("train.lr", s.train.lr, 1e-12, "a positive learning rate, e.g. 3.0e-4");
  c.at_least("train.min_lr", s.train.min_lr, 0.0, "use 0 to decay to zero");
  if (!c.bad({"train.lr", "train.min_lr"}) && s.train.min_lr > s.train.lr)
    c.error("train.min_lr", "train.min_lr = " + str(s.train.min_lr) + ": larger than train.lr = " +
                                str(s.train.lr) + "; the schedule decays from lr down to min_lr");
  c.at_least("train.warmup_steps", s.train.warmup_steps, 0, "use 0 for no warm-up");
  c.at_least("train.weight_decay", s.train.weight_decay, 0.0, "e.g. 0.1, or 0 for none");
  c.at_least("train.grad_clip", s.train.grad_clip, 0.0, "use 0 to turn clipping off");
  c.at_least("checkpoint.every", s.checkpoint.every, 0, "use 0 to save only at the end");
  check_memory_copies(c);
  c.at_least("fault.rank", s.fault.rank, 0, "the global rank that fails");
  c.at_least("fault.step", s.fault.step, 0, "the step after (or during whose save) it fails");
  c.at_least("fault.ms", s.fault.ms, 0, "milliseconds the slow rank adds to each step, e.g. 200");
  if (!c.bad({"entrypoint"}) && s.entrypoint.empty())
    c.error("entrypoint", "entrypoint is empty; use builtin or a command like [python3, train.py]");
}

// data.blend: indexed sources only, each with a path and a weight > 0.
void check_blend(const Checker& c, const DataSpec& d) {
  if (d.blend.empty() || c.bad({"data.blend", "data.format"})) return;
  if (d.format != DataFormat::indexed)
    c.error("data.blend", "data.blend needs data.format = indexed (Megatron PREFIX.idx/.bin sources), not " +
                              to_string(d.format) + "; set data.format: indexed");
  for (size_t i = 0; i < d.blend.size(); ++i) {
    const DataSource& src = d.blend[i];
    const std::string at = "data.blend[" + std::to_string(i) + "]";
    if (src.path.empty()) c.error("data.blend", at + ".path is empty; give the PREFIX of PREFIX.idx + PREFIX.bin");
    if (!(src.weight > 0))
      c.error("data.blend", at + ".weight = " + str(src.weight) + " (" + src.path +
                                "): must be > 0; drop the source instead of weighting it 0");
  }
}

void check_enums(const Checker& c) {
  const JobSpec& s = c.spec;
  c.one_of("cluster.device");
  c.one_of("cluster.backend");
  c.one_of("cluster.gloo_reduce_scatter");
  c.one_of("fault.kind");
  c.one_of("parallel.pipeline.schedule");
  c.at_least("parallel.pipeline.virtual_stages", s.parallel.pipeline_virtual_stages, 1,
             "use 1, or 2+ with schedule interleaved_1f1b");
  if (!c.bad({"parallel.pipeline.virtual_stages", "parallel.pipeline.schedule"}) &&
      s.parallel.pipeline_virtual_stages > 1 &&
      s.parallel.pipeline_schedule != PipelineSchedule::interleaved_1f1b)
    c.error("parallel.pipeline.virtual_stages",
            "parallel.pipeline.virtual_stages = " + std::to_string(s.parallel.pipeline_virtual_stages) +
                " needs parallel.pipeline.schedule interleaved_1f1b (it is " + to_string(s.parallel.pipeline_schedule) + ")");
  if (!c.bad({"parallel.pipeline.schedule", "train.recompute"}) && s.parallel.pipeline_schedule == PipelineSchedule::zb_h1 &&
      s.parallel.pp > 1 && s.train.recompute != Recompute::none)
    c.error("parallel.pipeline.schedule",
            "parallel.pipeline.schedule = zb_h1 with train.recompute = " + to_string(s.train.recompute) +
                ": the split backward would run each recomputed segment twice; use train.recompute none "
                "with zb_h1, or schedule 1f1b with recompute");
  if (!c.bad({"model.moe.experts", "train.recompute"}) && s.model.moe.experts > 0 &&
      s.train.recompute == Recompute::full)
    c.error("train.recompute", "train.recompute = full with model.moe.experts = " + std::to_string(s.model.moe.experts) +
                                   ": a recomputed MoE block loses its aux loss's gradient; use train.recompute "
                                   "selective or none with MoE");
  const bool uneven = !s.parallel.pipeline_layers_per_stage.empty();
  if (!c.bad({"parallel.pipeline.virtual_stages", "parallel.pp", "model.layers"}) && !uneven &&
      s.parallel.pipeline_virtual_stages > 1 && s.parallel.pp >= 1 &&
      s.model.layers % (s.parallel.pp * s.parallel.pipeline_virtual_stages) != 0)
    c.error("parallel.pipeline.virtual_stages",
            "parallel.pipeline.virtual_stages = " + std::to_string(s.parallel.pipeline_virtual_stages) +
                " with parallel.pp = " + std::to_string(s.parallel.pp) + " does not divide model.layers = " +
                std::to_string(s.model.layers) + " into equal stages; choose virtual_stages dividing layers / pp");
  c.one_of("model.tp_vocab");
  if (!c.bad({"model.tp_vocab"}) && s.model.tp_vocab == TpVocab::replicated && s.parallel.sequence_parallel &&
      s.parallel.tp > 1)
    c.error("model.tp_vocab", "model.tp_vocab = replicated with parallel.sequence_parallel is not implemented; "
                              "use model.tp_vocab parallel with sequence parallelism");
  c.one_of("model.kind", s.model.kind, {"gpt", "llama"});
  c.one_of("train.precision");
  c.one_of("train.recompute");
  c.one_of("train.nonfinite");
  c.one_of("train.offload.optimizer");
  c.one_of("train.offload.params");
  c.at_least("train.nonfinite_patience", s.train.nonfinite_patience, 1,
             "e.g. 3 (1 stops at the first non-finite step)");
  if (!s.train.init_from.empty() && s.train.init_from.find_first_not_of(" \t") == std::string::npos)
    c.error("train.init_from", "train.init_from is blank; give a Hugging Face model directory or a dtrain "
                               "checkpoint, or remove the field (random initialisation)");
  c.one_of("model.attention");
  c.one_of("parallel.reduce_dtype");
  if (!c.bad({"parallel.reduce_dtype", "parallel.zero"}) && s.parallel.reduce_dtype == ReduceDtype::bf16 &&
      s.parallel.zero > 0)
    c.error("parallel.reduce_dtype", "parallel.reduce_dtype = bf16 is implemented for DDP (parallel.zero 0) only, "
                                     "not parallel.zero = " + std::to_string(s.parallel.zero) +
                                     "; use reduce_dtype fp32 with ZeRO");
  if (!s.cluster.memory_per_rank.empty() && parse_byte_size(s.cluster.memory_per_rank) <= 0)
    c.error("cluster.memory_per_rank", "cluster.memory_per_rank = " + s.cluster.memory_per_rank +
                                           " is not a size; write e.g. 80GiB, 512MiB or a byte count");
  c.one_of("data.format");
  check_blend(c, s.data);
  if (!c.bad({"parallel.zero"}) && (s.parallel.zero < 0 || s.parallel.zero > 3))
    c.error("parallel.zero", "parallel.zero = " + str(s.parallel.zero) +
                                 ": must be 0 (DDP), 1, 2 or 3 (FSDP full shard)");
  if (!c.bad({"cluster.backend", "cluster.device"}) && s.cluster.backend == CommBackend::nccl &&
      s.cluster.device == DeviceKind::cpu)
    c.error("cluster.backend", "cluster.backend = nccl: NCCL needs cluster.device = cuda, "
                               "the device is cpu; use backend gloo (or auto), or device cuda");
  if (!c.bad({"log.live_peak", "cluster.device"}) && s.log.live_peak && s.cluster.device == DeviceKind::cuda)
    c.error("log.live_peak", "log.live_peak = true measures the CPU's matmul rate beside the steps; the device "
                             "is cuda, whose MFU peak is the start-up figure; set log.live_peak: false");
  const std::string& ep = s.cluster.rendezvous.endpoint;
  size_t colon = ep.rfind(':');
  bool port_ok = colon != std::string::npos && colon > 0 && colon + 1 < ep.size() &&
                 ep.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
                 ep.size() - colon <= 6 && std::stoi(ep.substr(colon + 1)) <= 65535;
  if (!c.bad({"cluster.rendezvous.endpoint"}) && !port_ok)
    c.error("cluster.rendezvous.endpoint",
            "cluster.rendezvous.endpoint = " + ep + ": expected host:port; e.g. 127.0.0.1:29400");
  const auto& rz = s.cluster.rendezvous;
  std::string tls_missing;
  for (auto [name, v] : {std::pair{"ca", &rz.tls_ca}, {"cert", &rz.tls_cert}, {"key", &rz.tls_key}})
    if (v->empty()) tls_missing += (tls_missing.empty() ? "" : ", ") + std::string(name);
  if (!tls_missing.empty() && tls_missing != "ca, cert, key")
    c.error("cluster.rendezvous.tls", "cluster.rendezvous.tls: ca, cert and key go together; " +
                                          tls_missing + " missing: name all three PEM files, or "
                                          "none (then the certificate is derived from the token)");
}

// parallel: dp(2) * tp(2) * pp(2) = 8 != cluster.nodes(1) * cluster.procs_per_node(4) = 4
void check_world(const Checker& c) {
  const JobSpec& s = c.spec;
  if (c.bad({"parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp", "cluster.nodes",
             "cluster.procs_per_node"}))
    return;
  const ParallelSpec& p = s.parallel;
  int nodes = s.cluster.nodes_max, ppn = s.cluster.procs_per_node;
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.cp < 1 || nodes < 1 || ppn < 1) return;  // reported above
  long long world = 1LL * p.dp * p.tp * p.pp * p.cp, slots = 1LL * nodes * ppn;
  const long long per_replica = 1LL * p.tp * p.pp * p.cp;
  const std::string cp_factor = p.cp > 1 ? " * cp(" + str(p.cp) + ")" : "";
  if (world == slots) return;
  std::string nodes_text = s.cluster.nodes_min == nodes
                               ? "cluster.nodes(" + str(nodes) + ")"
                               : "cluster.nodes(max " + str(nodes) + ")";
  std::string fix;
  if (slots % per_replica == 0)
    fix = "use dp " + std::to_string(slots / per_replica);
  if (world % nodes == 0)
    fix += (fix.empty() ? "set" : ", or set") + std::string(" cluster.procs_per_node: ") +
           std::to_string(world / nodes);
  if (fix.empty()) fix = "make dp * tp * pp" + std::string(p.cp > 1 ? " * cp" : "") + " equal to the number of worker slots";
  c.problems.error(c.origin.where_any({"parallel.dp", "parallel.tp", "parallel.pp", "parallel",
                                       "cluster.procs_per_node", "cluster.nodes"}),
                   "parallel: dp(" + str(p.dp) + ") * tp(" + str(p.tp) + ") * pp(" + str(p.pp) +
                       ")" + cp_factor + " = " + std::to_string(world) + " != " + nodes_text +
                       " * cluster.procs_per_node(" + str(ppn) + ") = " + std::to_string(slots) +
                       "; " + fix);
}

// "use tp 1, 2 or 4": the values of `axis` that divide `n` (and fit `cap`).
std::string choices(const std::string& axis, int n, int cap = 0) {
  std::vector<int> ok;
  for (int d : divisors(n))
    if (cap <= 0 || d <= cap) ok.push_back(d);
  if (ok.size() > 8) ok.erase(ok.begin() + 4, ok.end() - 3);  // 1, 2, 3, 4, ..., big ones
  return "use " + axis + " " + join_choices(ok);
}

// parallel.pipeline.layers_per_stage: one entry per global stage (pp x
// virtual_stages), each at least one block, summing to model.layers.
void check_layers_per_stage(const Checker& c) {
  const JobSpec& s = c.spec;
  const std::vector<int>& v = s.parallel.pipeline_layers_per_stage;
  const std::string path = "parallel.pipeline.layers_per_stage";
  if (v.empty() || c.bad({path, "parallel.pp", "parallel.pipeline.virtual_stages", "model.layers"})) return;
  std::string shown = "[";
  int sum = 0, smallest = v[0];
  for (size_t i = 0; i < v.size(); ++i) {
    shown += (i ? ", " : "") + str(v[i]);
    sum += v[i];
    smallest = std::min(smallest, v[i]);
  }
  shown += "]";
  const int stages = s.parallel.pp * s.parallel.pipeline_virtual_stages;
  if (static_cast<int>(v.size()) != stages)
    c.error(path, path + " = " + shown + " lists " + str(static_cast<int>(v.size())) + " stage(s) but parallel.pp = " +
                      str(s.parallel.pp) + " x parallel.pipeline.virtual_stages = " +
                      str(s.parallel.pipeline_virtual_stages) + " = " + str(stages) +
                      " stages; give one block count per stage (stage s = chunk * pp + rank)");
  if (smallest < 1)
    c.error(path, path + " = " + shown + " gives a stage " + str(smallest) +
                      " blocks; every stage needs at least 1 (use a smaller parallel.pp)");
  if (sum != s.model.layers)
    c.error(path, path + " = " + shown + " sums to " + str(sum) + " but model.layers = " + str(s.model.layers) +
                      "; make the entries add up to model.layers");
}

void check_divisibility(const Checker& c) {
  const JobSpec& s = c.spec;
  const ParallelSpec& p = s.parallel;
  const ModelSpec& m = s.model;
  int domain = s.cluster.topology.nvlink_domain;
  if (!c.bad({"parallel.tp", "model.heads"}) && p.tp >= 1 && m.heads >= 1 && m.heads % p.tp != 0)
    c.error("parallel.tp", "parallel.tp = " + str(p.tp) + " does not divide model.heads = " +
                               str(m.heads) + " (each TP rank holds heads/tp heads); " +
                               choices("tp", m.heads, domain));
  if (!c.bad({"parallel.tp", "model.vocab"}) && p.tp >= 1 && m.vocab >= 1 && m.vocab % p.tp != 0 &&
      m.tp_vocab != TpVocab::replicated)
    c.error("parallel.tp", "parallel.tp = " + str(p.tp) + " does not divide model.vocab = " +
                               str(m.vocab) + " (the embedding and the head are split by vocab rows); " +
                               choices("tp", m.vocab, domain));
  if (p.sequence_parallel && !c.bad({"parallel.tp", "model.seq_len"}) && p.tp >= 1 && m.seq_len >= 1 &&
      m.seq_len % p.tp != 0)
    c.error("parallel.sequence_parallel", "parallel.sequence_parallel needs model.seq_len = " + str(m.seq_len) +
                                              " divisible by parallel.tp = " + str(p.tp) + "; " +
                                              choices("tp", m.seq_len, domain));
  if (!c.bad({"parallel.pp", "model.layers"}) && p.pp >= 1 && m.layers >= 1 &&
      p.pipeline_layers_per_stage.empty() && m.layers % p.pp != 0)
    c.error("parallel.pp", "parallel.pp = " + str(p.pp) + " does not divide model.layers = " +
                               str(m.layers) + " (each stage holds layers/pp blocks); " +
                               choices("pp", m.layers) +
                               ", or give parallel.pipeline.layers_per_stage (e.g. [" +
                               str(m.layers / p.pp + 1) + ", ...]) summing to model.layers");
  if (!c.bad({"parallel.tp", "cluster.topology.nvlink_domain"}) && domain > 0 && p.tp > domain) {
    std::string text = "parallel.tp = " + str(p.tp) +
                       " is larger than cluster.topology.nvlink_domain = " + str(domain) +
                       ": a TP group must sit inside one NVLink island; use tp <= " + str(domain) +
                       " and put the rest in dp or pp";
    if (s.cluster.topology.allow_slow)  // --allow-slow: the user accepts TP over a slower link
      c.problems.warn(text + " (allowed by cluster.topology.allow_slow: TP traffic crosses a slower link)");
    else
      c.error("parallel.tp", text + ", or pass --allow-slow");
  }
  if (!c.bad({"parallel.ep", "parallel.dp", "parallel.tp"}) && p.ep >= 1 && p.dp >= 1 &&
      p.tp >= 1 && (p.dp * p.tp) % p.ep != 0)
    c.error("parallel.ep", "parallel.ep = " + str(p.ep) + " does not divide dp * tp = " +
                               str(p.dp * p.tp) + " (expert groups are made of the DP x TP "
                               "ranks of a stage); " + choices("ep", p.dp * p.tp));
  if (!c.bad({"model.d_model", "model.heads"}) && m.d_model >= 1 && m.heads >= 1 &&
      m.d_model % m.heads != 0)
    c.error("model.heads", "model.d_model = " + str(m.d_model) +
                               " is not divisible by model.heads = " + str(m.heads) +
                               " (head size = d_model / heads); " +
                               choices("heads", m.d_model));
}

// Products of fields, computed in 64 bits (or doubles) so that no value
// overflows before it is compared with its stated maximum.
void check_sizes(const Checker& c) {
  const JobSpec& s = c.spec;
  constexpr int64_t kMaxGlobalBatch = int64_t(1) << 24;  // samples per step
  if (!c.bad({"train.micro_batch", "train.grad_accum", "parallel.dp"}) && s.train.micro_batch >= 1 &&
      s.train.grad_accum >= 1 && s.parallel.dp >= 1) {
    const int64_t gbs = int64_t(s.train.micro_batch) * s.train.grad_accum * s.parallel.dp;
    if (gbs > kMaxGlobalBatch)
      c.problems.error(c.origin.where_any({"train.micro_batch", "train.grad_accum", "parallel.dp"}),
                       "train.micro_batch(" + str(s.train.micro_batch) + ") * train.grad_accum(" +
                           str(s.train.grad_accum) + ") * parallel.dp(" + str(s.parallel.dp) +
                           ") = " + std::to_string(gbs) + " samples per step is more than the "
                           "maximum " + std::to_string(kMaxGlobalBatch) +
                           "; use a smaller train.micro_batch");
  }
  // The model's parameter count against its maximum is plan/'s check
  // (plan/model_size.h): the count is stated once, there.
}

// The fault section's relations: what each kind needs, and its announcement.
void check_fault(const Checker& c) {
  const FaultSpec& f = c.spec.fault;
  if (c.bad({"fault.kind", "fault.step", "fault.ms"})) return;
  const bool after_step =
      f.kind == FaultKind::kill_after_step || f.kind == FaultKind::hang || f.kind == FaultKind::raise ||
      f.kind == FaultKind::nan_grad;
  if (after_step && f.step == 0)
    c.error("fault.step", "fault.step = 0: fault.kind = " + to_string(f.kind) +
                              (f.kind == FaultKind::raise || f.kind == FaultKind::nan_grad ? " strikes in" : " strikes after") +
                              " step fault.step, and steps count from 1; use fault.step >= 1");
  if (f.kind == FaultKind::slow && f.ms == 0)
    c.error("fault.ms", "fault.ms = 0: fault.kind = slow adds fault.ms milliseconds to every "
                        "step; set fault.ms > 0, e.g. 200");
  if (f.kind != FaultKind::slow && f.ms > 0)
    c.problems.warn("fault.ms = " + str(f.ms) + " is ignored: only fault.kind = slow uses it "
                    "(fault.kind = " + to_string(f.kind) + ")");
  const ParallelSpec& p = c.spec.parallel;
  if (f.kind == FaultKind::no_tp_reduce && p.tp == 1)
    c.problems.warn("fault.kind = no_tp_reduce does nothing with parallel.tp = 1: no layer is row-parallel; "
                    "use parallel.tp >= 2");
  if (f.kind == FaultKind::no_pp_grad && p.pp == 1)
    c.problems.warn("fault.kind = no_pp_grad does nothing with parallel.pp = 1: no stage sends a gradient back; "
                    "use parallel.pp >= 2");
  if (f.active() && !c.bad({"fault.rank"}))
    c.problems.warn("fault.kind = " + to_string(f.kind) + " (rank " + str(f.rank) + ", step " + str(f.step) +
                    (f.kind == FaultKind::slow ? ", " + str(f.ms) + " ms" : "") +
                    "): this run injects a fault on purpose (chaos testing); "
                    "remove the fault section for a real run");
}

// Legal but poor choices, and settings that are ignored.
void check_warnings(const Checker& c) {
  const JobSpec& s = c.spec;
  const ParallelSpec& p = s.parallel;
  int m = s.train.grad_accum;
  if (p.pp > 1 && m >= 1 && m < p.pp) {
    int bubble = static_cast<int>(100.0 * (p.pp - 1) / (m + p.pp - 1) + 0.5);
    c.problems.warn("train.grad_accum = " + str(m) + " < parallel.pp = " + str(p.pp) +
                    ": the pipeline runs " + str(m) + " micro-batch(es) over " + str(p.pp) +
                    " stages, a bubble of " + str(bubble) +
                    "% of the step (half or more); set train.grad_accum >= " + str(p.pp) +
                    " (4 * pp keeps it under 20%)");
  }
  if (p.sequence_parallel && p.tp == 1)
    c.problems.warn("parallel.sequence_parallel = true with parallel.tp = 1: sequence parallelism "
                    "splits the tensor-parallel group's positions; with tp 1 it does nothing");
  if (p.zero > 0 && p.dp == 1)
    c.problems.warn("parallel.zero = " + str(p.zero) +
                    " with parallel.dp = 1: there is nothing to shard across; ZeRO has no effect");
  if (s.train.nonfinite == NonfiniteAction::skip_step &&
      s.train.nonfinite_patience != TrainSpec{}.nonfinite_patience && !c.bad({"train.nonfinite_patience"}))
    c.problems.warn("train.nonfinite_patience = " + str(s.train.nonfinite_patience) +
                    " is ignored: train.nonfinite = skip_step never stops for non-finite steps "
                    "(train.nonfinite: stop stops after that many in a row)");
  check_fault(c);
  // These kinds act on every rank: fault.rank does not apply.
  const bool every_rank = s.fault.every_rank();
  if (s.fault.active() && !every_rank && s.fault.rank >= s.world() &&
      !c.bad({"fault.rank"}))
    c.error("fault.rank", "fault.rank = " + str(s.fault.rank) + ": the job has " + str(s.world()) +
                              " ranks; use a rank below " + str(s.world()));
  if (s.checkpoint.every > 0 && s.checkpoint.dir.empty())
    c.problems.warn("checkpoint.every = " + str(s.checkpoint.every) +
                    " is ignored: checkpoint.dir is empty, so no checkpoints are written");
  if (s.train.warmup_steps > s.train.steps)
    c.problems.warn("train.warmup_steps = " + str(s.train.warmup_steps) + " > train.steps = " +
                    str(s.train.steps) + ": the run ends before the warm-up does");
}

}  // namespace

void check_enum_name(const SpecOrigin& origin, Problems& problems, const std::string& path) {
  auto it = origin.unknown_names.find(path);
  if (it == origin.unknown_names.end()) return;
  JobSpec defaults;
  for (const auto& field : spec_fields())
    if (path == field.path)
      problems.error(origin.where(path),
                     not_one_of(path, it->second, *std::get<EnumRef>(field.bind(defaults)).names));
}

void validate_spec(const JobSpec& spec, const SpecOrigin& origin, Problems& problems) {
  Checker c{spec, origin, problems};
  check_ranges(c);
  check_enums(c);
  check_world(c);
  check_divisibility(c);
  check_layers_per_stage(c);
  check_sizes(c);
  check_warnings(c);
  validate_moe(spec, origin, problems);
  validate_llama(spec, origin, problems);
  validate_cp(spec, origin, problems);
  validate_valid(spec, origin, problems);
  validate_job_name(spec, origin, problems);
  validate_trace(spec, origin, problems);
  validate_offload(spec, origin, problems);
}

}  // namespace dtrain::detail
