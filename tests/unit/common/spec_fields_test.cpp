// Spec coverage from the field table: every row of detail::spec_fields() is set
// to a non-default value through YAML text and through --set, read back,
// printed (YAML and JSON) and read again. The values come from kExamples below
// (bools: the default flipped); a field without one fails naming the field, so
// a new field cannot skip this test. Error messages live in job_spec_errors_test.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "common/spec_detail.h"
#include "tests/support/spec_errors.h"

namespace {

using dtrain::JobSpec;
using dtrain::detail::Field;

// One non-default value per field, written as job_spec_to_yaml prints it.
// `context`: the other fields ("path=value") the value needs to be valid
// (a tp 2 needs two worker slots); the test checks that nothing but the field
// and its context changed. `refused`: the field has no valid value but its
// default (model.kind: gpt only), so this value must be refused naming it.
struct Example {
  const char* path = nullptr;
  const char* value = nullptr;
  std::vector<std::string> context = {};
  bool refused = false;
};

const std::vector<Example> kExamples = {
    {"job.name", "spec-fields"},
    {"job.seed", "99"},
    {"cluster.nodes", "\"1:4\"", {"parallel.dp=auto"}},
    {"cluster.procs_per_node", "2", {"parallel.dp=2"}},
    {"cluster.device", "cuda"},
    {"cluster.backend", "gloo"},
    {"cluster.gloo_reduce_scatter", "native"},
    {"cluster.hier_allreduce", "false"},
    {"cluster.max_restarts", "3"},
    {"cluster.warm_spares", "false"},
    {"cluster.recover_in_place", "false"},
    {"cluster.live_recovery", "false"},
    {"cluster.grace_s", "7.5"},
    {"cluster.hang_timeout_s", "90.5"},
    {"cluster.hang_timeout_steps", "4.5", {"cluster.hang_timeout_s=60"}},
    {"cluster.memory_per_rank", "80GiB"},
    {"cluster.rendezvous.endpoint", "node0:1234"},
    {"cluster.rendezvous.join_timeout_s", "30"},
    {"cluster.rendezvous.last_call_s", "1.5"},
    {"cluster.rendezvous.heartbeat_s", "0.5"},
    {"cluster.rendezvous.rejoin_timeout_s", "12.5"},
    {"cluster.rendezvous.token_file", "/etc/dtrain/token"},
    {"cluster.rendezvous.advertise_addr", "10.0.0.7"},
    {"cluster.rendezvous.tls.ca", "/etc/dtrain/ca.pem",
     {"cluster.rendezvous.tls.cert=/etc/dtrain/cert.pem", "cluster.rendezvous.tls.key=/etc/dtrain/key.pem"}},
    {"cluster.rendezvous.tls.cert", "/etc/dtrain/cert.pem",
     {"cluster.rendezvous.tls.ca=/etc/dtrain/ca.pem", "cluster.rendezvous.tls.key=/etc/dtrain/key.pem"}},
    {"cluster.rendezvous.tls.key", "/etc/dtrain/key.pem",
     {"cluster.rendezvous.tls.ca=/etc/dtrain/ca.pem", "cluster.rendezvous.tls.cert=/etc/dtrain/cert.pem"}},
    {"cluster.topology.nvlink_domain", "4"},
    {"parallel.dp", "2", {"cluster.procs_per_node=2"}},
    {"parallel.tp", "2", {"cluster.procs_per_node=2"}},
    {"parallel.pp", "2", {"cluster.procs_per_node=2"}},
    {"parallel.ep", "2", {"cluster.procs_per_node=2", "parallel.dp=2", "model.moe.experts=2"}},
    {"parallel.cp", "2", {"cluster.procs_per_node=2", "model.attention=tiled"}},
    {"parallel.order", "cp-tp-dp-pp"},
    {"parallel.zero", "2"},
    {"parallel.pipeline.schedule", "gpipe"},
    {"parallel.pipeline.virtual_stages", "2",
     {"cluster.procs_per_node=2", "parallel.pp=2", "parallel.pipeline.schedule=interleaved_1f1b",
      "model.layers=4"}},
    {"parallel.pipeline.layers_per_stage", "[1, 3]",
     {"cluster.procs_per_node=2", "parallel.pp=2", "model.layers=4"}},
    {"parallel.ddp.bucket_mb", "12.5"},
    {"parallel.reduce_dtype", "bf16"},
    {"model.kind", "llama"},
    {"model.vocab", "512"},
    {"model.layers", "4"},
    {"model.d_model", "96"},
    {"model.heads", "8"},
    {"model.seq_len", "128"},
    {"model.dropout", "0.1"},
    {"model.tp_vocab", "replicated"},
    {"model.moe.experts", "4"},
    {"model.moe.top_k", "2", {"model.moe.experts=4"}},
    {"model.moe.capacity_factor", "1.5"},
    {"model.moe.aux_loss_coef", "0.02"},
    {"model.moe.every", "2"},
    {"model.moe.balance", "bias"},
    {"model.moe.bias_rate", "0.01"},
    {"model.moe.d_ff", "128"},
    {"model.attention", "tiled"},
    {"model.kv_heads", "2", {"model.kind=llama"}},
    {"model.ffn_hidden", "176", {"model.kind=llama"}},
    {"model.norm_eps", "1e-06", {"model.kind=llama"}},
    {"model.rope_theta", "5e+05", {"model.kind=llama"}},
    {"model.rope_scaling.factor", "8.0", {"model.kind=llama"}},
    {"model.rope_scaling.low_freq_factor", "2.0", {"model.kind=llama"}},
    {"model.rope_scaling.high_freq_factor", "8.0", {"model.kind=llama"}},
    {"model.rope_scaling.original_max_position", "4096", {"model.kind=llama"}},
    {"model.tie_embeddings", "true", {"model.kind=llama"}},
    {"train.steps", "7"},
    {"train.micro_batch", "3"},
    {"train.grad_accum", "auto", {"train.global_batch=16"}},
    {"train.global_batch", "8"},
    {"train.lr", "0.001"},
    {"train.min_lr", "1e-05"},
    {"train.warmup_steps", "2"},
    {"train.weight_decay", "0.01"},
    {"train.beta1", "0.8"},
    {"train.beta2", "0.99"},
    {"train.adam_eps", "1e-06"},
    {"train.grad_clip", "0.5"},
    {"train.precision", "bf16"},
    {"train.recompute", "selective"},
    {"train.nonfinite", "skip_step"},
    {"train.nonfinite_patience", "5"},
    {"train.init_from", "hf/llama-1b"},
    {"train.offload.optimizer", "nvme", {"train.offload.path=/scratch"}},
    {"train.offload.params", "nvme", {"parallel.zero=3", "train.offload.path=/scratch"}},
    {"train.offload.path", "/scratch"},
    {"train.offload.bucket_mb", "0.5"},
    {"data.path", "/data/tokens.bin"},
    {"data.format", "tokens-u16"},
    {"data.blend", "[{path: a, weight: 0.7}, {path: b, weight: 0.3}]", {"data.format=indexed"}},
    {"data.valid.path", "/data/valid.bin"},
    {"data.valid.split", "0.01"},
    {"data.valid.blend", "[{path: va, weight: 0.7}, {path: vb, weight: 0.3}]"},
    {"data.valid.every", "50"},
    {"data.valid.batches", "4"},
    {"checkpoint.dir", "ck"},
    {"checkpoint.every", "3"},
    {"checkpoint.keep", "1"},
    {"checkpoint.async", "true"},
    {"checkpoint.memory.every", "2", {"cluster.nodes=2", "parallel.dp=2"}},
    {"checkpoint.memory.replicas", "2", {"cluster.nodes=3", "parallel.dp=3"}},
    {"log.dir", "logs"},
    {"log.every", "2"},
    {"log.trace.steps", "[1, 2]"},
    {"fault.kind", "raise", {"fault.step=1"}},
    {"fault.rank", "1"},
    {"fault.step", "3"},
    {"fault.ms", "200"},
    {"entrypoint", "[python3, train.py]"},
};

std::string text_of(const Field& f, const JobSpec& spec) {
  JobSpec copy = spec;  // the table binds to a mutable spec
  return dtrain::detail::field_text(f.bind(copy));
}

// The field's example: kExamples' row, else a bool's default flipped; false
// when there is neither.
bool example_of(const Field& f, Example* out) {
  for (const auto& e : kExamples)
    if (std::string(e.path) == f.path) return *out = e, true;
  JobSpec defaults;
  const dtrain::detail::FieldRef ref = f.bind(defaults);
  if (auto* b = std::get_if<bool*>(&ref)) {
    *out = Example{f.path, **b ? "false" : "true"};
    return true;
  }
  return false;
}

// "a.b.c" = v pairs as nested block YAML.
struct Tree {
  std::map<std::string, Tree> kids;
  std::string value;
};

void put(Tree& t, const std::string& path, const std::string& value) {
  size_t dot = path.find('.');
  if (dot == std::string::npos) {
    t.kids[path].value = value;
    return;
  }
  put(t.kids[path.substr(0, dot)], path.substr(dot + 1), value);
}

std::string yaml_of(const Tree& t, int indent = 0) {
  std::string out;
  for (const auto& [key, kid] : t.kids)
    out += std::string(indent, ' ') + key + ":" +
           (kid.kids.empty() ? " " + kid.value + "\n" : "\n" + yaml_of(kid, indent + 2));
  return out;
}

std::string yaml_of(const std::vector<std::string>& sets) {
  Tree t;
  for (const auto& s : sets) put(t, s.substr(0, s.find('=')), s.substr(s.find('=') + 1));
  return yaml_of(t);
}

JobSpec parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return dtrain::parse_job_spec(text, "fields.yaml", overrides);
}

// The fields whose printed value differs between a and b.
std::set<std::string> changed(const JobSpec& a, const JobSpec& b) {
  std::set<std::string> out;
  for (const auto& f : dtrain::detail::spec_fields())
    if (text_of(f, a) != text_of(f, b)) out.insert(f.path);
  return out;
}

// Sets one field through YAML, through --set over a file holding its default,
// and checks each spec holds the value, prints and reads back with it, and
// changed no other field (a row bound to another field's member would).
void check_field_or_throw(const Field& f, const Example& e) {
  const std::string path = f.path, value = e.value;
  INFO("spec field " << path << " = " << value
                     << " (its example in tests/unit/common/spec_fields_test.cpp)");
  std::vector<std::string> sets = e.context;
  sets.push_back(path + "=" + value);
  if (e.refused) {
    std::string message;
    try {
      parse(yaml_of(sets));
    } catch (const dtrain::Error& err) {
      message = err.message();
    }
    CHECK_MESSAGE(message.find(path + " = " + value) != std::string::npos,
                  path << " = " << value << " must be refused naming the field; got: " << message);
    return;
  }
  const JobSpec defaults;
  CHECK_MESSAGE(text_of(f, defaults) != value, path << ": the example " << value
                                                    << " is the default; give a non-default value");
  std::vector<std::string> with_default = e.context;
  with_default.push_back(path + "=" + text_of(f, defaults));
  const std::map<std::string, JobSpec> specs = {
      {"YAML text", parse(yaml_of(sets))},
      {"--set over the default in the file", parse(yaml_of(with_default), {path + "=" + value})}};
  std::set<std::string> expected_changes = {path};
  for (const auto& c : e.context) expected_changes.insert(c.substr(0, c.find('=')));
  for (const auto& [how, spec] : specs) {
    CHECK_MESSAGE(text_of(f, spec) == value, path << " through " << how << " reads back as "
                                                  << text_of(f, spec) << ", not " << value);
    for (const auto& other : changed(defaults, spec))
      CHECK_MESSAGE(expected_changes.count(other), "setting " << path << " through " << how
                                                              << " also changed " << other);
    const JobSpec from_yaml = parse(dtrain::job_spec_to_yaml(spec));
    CHECK_MESSAGE(text_of(f, from_yaml) == value, path << " through " << how << ", printed as YAML and read again: "
                                                       << text_of(f, from_yaml) << ", not " << value);
    const JobSpec from_json = parse(dtrain::job_spec_to_json(spec));
    CHECK_MESSAGE(text_of(f, from_json) == value, path << " through " << how << ", printed as JSON and read again: "
                                                       << text_of(f, from_json) << ", not " << value);
  }
}

void check_field(const Field& f, const Example& e) {
  try {
    check_field_or_throw(f, e);
  } catch (const dtrain::Error& err) {
    FAIL_CHECK("spec field " << std::string(f.path) << " = " << std::string(e.value) << " (with " << e.context.size()
                             << " context fields): " << err.message());
  }
}

}  // namespace

TEST_CASE("spec fields: every field of the table has a non-default example") {
  std::set<std::string> table;
  for (const auto& f : dtrain::detail::spec_fields()) {
    table.insert(f.path);
    Example e;
    CHECK_MESSAGE(example_of(f, &e), "spec field " << std::string(f.path)
                                                   << " has no non-default example: add {\"" << std::string(f.path)
                                                   << "\", \"VALUE\"} to kExamples in "
                                                      "tests/unit/common/spec_fields_test.cpp");
  }
  std::set<std::string> seen;
  for (const auto& e : kExamples) {
    CHECK_MESSAGE(table.count(e.path), "kExamples names " << std::string(e.path)
                                                          << ", which is not a field of spec_fields(): "
                                                             "the parser and printer no longer know it");
    CHECK_MESSAGE(seen.insert(e.path).second, "kExamples has two rows for " << std::string(e.path));
  }
}

TEST_CASE("spec fields: each set through YAML and --set holds its value, prints and reads back") {
  int checked = 0;
  for (const auto& f : dtrain::detail::spec_fields()) {
    Example e;
    if (!example_of(f, &e)) continue;  // failed in the case above
    check_field(f, e);
    ++checked;
  }
  MESSAGE(checked << " of " << dtrain::detail::spec_fields().size() << " fields checked");
  CHECK(checked == int(dtrain::detail::spec_fields().size()));
}

// An enum field's text is read against its names when it is converted and
// reported by the validator in its turn: a field whose report is missing
// would silently keep its default.
TEST_CASE("spec fields: every enum field refuses an unknown name, naming the field and its names") {
  JobSpec defaults;
  int checked = 0;
  for (const auto& f : dtrain::detail::spec_fields()) {
    const auto ref = f.bind(defaults);
    if (!std::holds_alternative<dtrain::detail::EnumRef>(ref)) continue;
    const std::vector<std::string>& names = *std::get<dtrain::detail::EnumRef>(ref).names;
    std::string list;
    for (size_t i = 0; i < names.size(); ++i)
      list += (i ? (i + 1 == names.size() ? " or " : ", ") : "") + names[i];
    const std::string path = f.path;
    const std::string e = dtrain::testing::config_error_of("", "e.yaml", {path + "=no_such_name"});
    const std::string want = "--set " + path + "=no_such_name: " + path + " = no_such_name: must be " + list;
    CHECK_MESSAGE(dtrain::testing::has(e, want), path << " took an unknown name without the error");
    ++checked;
  }
  MESSAGE(checked << " enum fields checked");
  CHECK(checked >= 11);
}
