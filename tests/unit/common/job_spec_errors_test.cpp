// Job spec errors and warnings: every rule has a case that checks the message
// names the field, the value, where it came from (file:line:col or --set) and
// the fix; several problems are reported together.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "tests/support/spec_errors.h"

using dtrain::parse_job_spec;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return dtrain::testing::config_error_of(text, "t.yaml", overrides);
}

std::vector<std::string> warnings_of(const std::string& text,
                                     const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> w;
  parse_job_spec(text, "t.yaml", overrides, &w);
  return w;
}

using dtrain::testing::has;

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// A valid 8-rank base to break one field at a time.
const std::string kBase =
    "cluster: {nodes: 1, procs_per_node: 8}\n"
    "parallel: {dp: 2, tp: 2, pp: 2}\n"
    "model: {layers: 4, d_model: 64, heads: 4}\n"
    "train: {grad_accum: 4}\n";

}  // namespace

TEST_CASE("spec errors: the base spec is valid") { CHECK(error_of(kBase) == ""); }

TEST_CASE("spec errors: malformed YAML names line and column") {
  std::string e = error_of("job: {name: x\nparallel: [1, 2\n");
  CHECK(has(e, "t.yaml:"));
  CHECK(has(e, "malformed YAML"));
  e = error_of("job:\n  name: x\n   seed: 1\n");
  CHECK(has(e, "t.yaml:3:"));
}

TEST_CASE("spec errors: positions are file:line:col, 1-based, at the value") {
  std::string e = error_of("job: {name: x}\nparallel:\n  dp: 0\n");
  CHECK(has(e, "t.yaml:3:7: parallel.dp = 0: must be >= 1"));
}

TEST_CASE("spec errors: wrong types name the field, the value and the type") {
  CHECK(has(error_of("parallel: {dp: two}"), "parallel.dp: expected an integer, got 'two'"));
  CHECK(has(error_of("parallel: {dp: 2.5}"), "parallel.dp: expected an integer, got '2.5'"));
  CHECK(has(error_of("parallel: {dp: [1]}"), "parallel.dp: expected an integer, got a list"));
  CHECK(has(error_of("parallel: {dp: }"), "parallel.dp: expected an integer, got nothing"));
  CHECK(has(error_of("train: {lr: fast}"), "train.lr: expected a number, got 'fast'"));
  CHECK(has(error_of("parallel: {ddp: {overlap: maybe}}"),
            "parallel.ddp.overlap: expected true or false, got 'maybe'"));
  CHECK(has(error_of("job: {seed: -1}"), "job.seed: expected a non-negative integer"));
  CHECK(has(error_of("job: {name: {a: 1}}"), "job.name: expected a string, got a mapping"));
  CHECK(has(error_of("cluster: {nodes: two}"), "cluster.nodes: expected a node count"));
  CHECK(has(error_of("entrypoint: {a: 1}"), "entrypoint: expected builtin, a command string"));
  CHECK(has(error_of("parallel: 3"), "parallel: expected a section (mapping), got '3'"));
  CHECK(has(error_of("- a\n- b\n"), "the spec must be a mapping"));
  // The fix shows how to write it.
  CHECK(has(error_of("parallel: {dp: two}"), "write it like dp: 1"));
}

TEST_CASE("spec errors: a bad type is reported once, not again by the rules using it") {
  std::string e = error_of("cluster: {procs_per_node: 8}\nparallel: {dp: two, tp: 2, pp: 2}\n"
               "model: {layers: 4}\n");
  CHECK(has(e, "parallel.dp: expected an integer"));
  CHECK(e.find("dp(") == std::string::npos);
}

TEST_CASE("spec errors: unknown keys, with did-you-mean") {
  std::string e = error_of("parallel: {tpp: 2}");
  CHECK(has(e, "t.yaml:1:12: unknown key 'parallel.tpp' (did you mean parallel.tp?)"));
  CHECK(has(error_of("paralel: {tp: 1}"), "unknown key 'paralel' (did you mean parallel?)"));
  CHECK(has(error_of("cluster: {procs_per_nod: 1}"), "did you mean cluster.procs_per_node?"));
  CHECK(has(error_of("parallel: {pipeline: {schedul: gpipe}}"),
            "did you mean parallel.pipeline.schedule?"));
  // A key of another section is pointed to its section.
  CHECK(has(error_of("train: {seq_len: 64}"), "did you mean model.seq_len?"));
  // Nothing close: no suggestion, but still an error.
  e = error_of("model: {zzzzzzzz: 1}");
  CHECK(has(e, "unknown key 'model.zzzzzzzz'"));
  CHECK(e.find("did you mean") == std::string::npos);
  CHECK(has(error_of("job: {name: a, name: b}"), "job.name appears twice"));
}

TEST_CASE("spec errors: a token in the YAML is refused, without echoing it") {
  std::string e = error_of("cluster: {rendezvous: {token: s3cret}}");
  CHECK(has(e, "cluster.rendezvous.token"));
  CHECK(has(e, "tokens never go in the YAML"));
  CHECK(has(e, "DTRAIN_TOKEN"));
  CHECK(has(e, "token_file"));
  CHECK(e.find("s3cret") == std::string::npos);
  CHECK(has(error_of("", {"cluster.rendezvous.token=abc"}), "tokens never go in the YAML"));
}

TEST_CASE("spec errors: zero and negative sizes") {
  for (const char* field : {"parallel.dp", "parallel.tp", "parallel.pp", "parallel.ep",
                            "model.vocab", "model.layers", "model.d_model", "model.heads",
                            "model.seq_len", "train.steps", "train.micro_batch",
                            "train.grad_accum", "cluster.procs_per_node", "log.every",
                            "checkpoint.keep", "cluster.nodes"}) {
    CAPTURE(field);
    for (const char* v : {"0", "-2"}) {
      std::string e = error_of("", {std::string(field) + "=" + v});
      CHECK(has(e, "--set " + std::string(field) + "=" + v + ": " + field + " = " + v +
                       ": must be >= 1"));
    }
  }
  CHECK(has(error_of("train: {lr: 0}"), "train.lr = 0.0: must be >= "));
  CHECK(has(error_of("train: {beta2: 1}"), "train.beta2 = 1.0: must be in [0, 1)"));
  CHECK(has(error_of("model: {dropout: -0.1}"), "model.dropout = -0.1: must be in [0, 1)"));
  CHECK(has(error_of("train: {grad_clip: -1}"), "train.grad_clip = -1.0: must be >= 0"));
  CHECK(has(error_of("cluster: {max_restarts: -1}"), "cluster.max_restarts = -1: must be >= 0"));
  CHECK(has(error_of("cluster: {hang_timeout_steps: 3}"),
            "cluster.hang_timeout_steps = 3.0 needs cluster.hang_timeout_s > 0"));
  CHECK(error_of("cluster: {hang_timeout_s: 60, hang_timeout_steps: 3}") == "");
  CHECK(has(error_of("train: {lr: 1.0e-4, min_lr: 1.0e-3}"), "train.min_lr = 0.001: larger"));
  CHECK(has(error_of("cluster: {nodes: \"4:2\"}"), "cluster.nodes = 4:2"));
  CHECK(has(error_of("entrypoint: []"), "entrypoint is empty"));
  CHECK(has(error_of("job: {name: ''}"), "job.name is empty"));
}

TEST_CASE("spec errors: the mesh must fill the cluster, every factor printed") {
  std::string e = error_of("cluster: {procs_per_node: 4}\nparallel: {dp: 2, tp: 2, pp: 2}\n"
                           "model: {layers: 4}\ntrain: {grad_accum: 2}\n");
  CHECK(has(e, "parallel: dp(2) * tp(2) * pp(2) = 8 != cluster.nodes(1) * "
               "cluster.procs_per_node(4) = 4"));
  CHECK(has(e, "use dp 1"));
  CHECK(has(e, "t.yaml:2:"));
  // Elastic: the maximum number of nodes counts.
  e = error_of("cluster: {nodes: 1:4, procs_per_node: 2}\nparallel: {dp: 4}\n");
  CHECK(has(e, "dp(4) * tp(1) * pp(1) = 4 != cluster.nodes(max 4) * "
               "cluster.procs_per_node(2) = 8"));
  CHECK(error_of("cluster: {nodes: 1:4, procs_per_node: 2}\nparallel: {dp: 8}\n") == "");
}

TEST_CASE("spec errors: heads % tp names tp, heads and the valid choices") {
  std::string e = error_of(kBase, {"parallel.tp=3"});
  CHECK(has(e, "--set parallel.tp=3: parallel.tp = 3 does not divide model.heads = 4"));
  CHECK(has(e, "use tp 1, 2 or 4"));
  // With an NVLink island the choices stop at its size.
  e = error_of("cluster: {procs_per_node: 3, topology: {nvlink_domain: 4}}\n"
               "parallel: {tp: 3}\nmodel: {heads: 8, d_model: 64}\n");
  CHECK(has(e, "t.yaml:2:16: parallel.tp = 3 does not divide model.heads = 8"));
  CHECK(has(e, "use tp 1, 2 or 4"));
}

TEST_CASE("spec errors: layers % pp names pp, layers and the choices") {
  std::string e = error_of("cluster: {procs_per_node: 3}\nparallel: {pp: 3}\n"
                           "model: {layers: 4}\ntrain: {grad_accum: 3}\n");
  CHECK(has(e, "t.yaml:2:16: parallel.pp = 3 does not divide model.layers = 4"));
  CHECK(has(e, "use pp 1, 2 or 4"));
}

TEST_CASE("spec errors: TP larger than an NVLink island") {
  std::string e = error_of(kBase, {"cluster.topology.nvlink_domain=1"});
  CHECK(has(e, "parallel.tp = 2 is larger than cluster.topology.nvlink_domain = 1"));
  CHECK(has(e, "use tp <= 1"));
  CHECK(error_of(kBase, {"cluster.topology.nvlink_domain=2"}) == "");
  CHECK(error_of(kBase, {"cluster.topology.nvlink_domain=0"}) == "");  // 0 = whole node
}

TEST_CASE("spec errors: ep must divide dp * tp") {
  std::string e = error_of(kBase, {"parallel.ep=3"});
  CHECK(has(e, "--set parallel.ep=3: parallel.ep = 3 does not divide dp * tp = 4"));
  CHECK(has(e, "use ep 1, 2 or 4"));
  CHECK(error_of(kBase, {"parallel.ep=4", "model.moe.experts=4"}) == "");
}

TEST_CASE("spec errors: d_model % heads") {
  std::string e = error_of("model: {d_model: 100, heads: 8}");
  CHECK(has(e, "model.d_model = 100 is not divisible by model.heads = 8"));
  CHECK(has(e, "use heads 1, 2, 4, 5"));
}

TEST_CASE("spec errors: enums list the choices") {
  CHECK(has(error_of("cluster: {device: tpu}"), "cluster.device = tpu: must be cpu or cuda"));
  CHECK(has(error_of("cluster: {backend: mpi}"),
            "cluster.backend = mpi: must be auto, gloo or nccl"));
  CHECK(has(error_of("cluster: {gloo_reduce_scatter: tree}"),
            "cluster.gloo_reduce_scatter = tree: must be ring or native"));
  CHECK(has(error_of("parallel: {pipeline: {schedule: 1f1c}}"),
            "parallel.pipeline.schedule = 1f1c: must be gpipe, 1f1b, interleaved_1f1b or zb_h1 (did you mean 1f1b?)"));
  CHECK(has(error_of("data: {format: text}"),
            "data.format = text: must be bytes, tokens-u16, tokens-u32, indexed or synthetic"));
  CHECK(has(error_of("train: {precision: fp8}"),
            "train.precision = fp8: must be fp32, bf16 or fp16"));
  CHECK(has(error_of("model: {kind: mamba}"), "model.kind = mamba: must be gpt or llama"));
  CHECK(has(error_of("model: {kind: llama, heads: 4, kv_heads: 3}"), "model.kv_heads = 3 with model.heads = 4"));
  CHECK(has(error_of("model: {kv_heads: 2}"), "model.kv_heads is a field of model.kind llama"));
  CHECK(has(error_of("model: {kind: llama, heads: 4, kv_heads: 2}\nparallel: {tp: 3}\ncluster: {procs_per_node: 3}"),
            "model.kv_heads = 2 with parallel.tp = 3"));
  CHECK(has(error_of("model: {kind: llama, heads: 4, kv_heads: 2, ffn_hidden: 90}\nparallel: {tp: 4}\n"
                     "cluster: {procs_per_node: 4}"),
            "model.ffn_hidden = 90 is not divisible by parallel.tp = 4"));
  CHECK(has(error_of("parallel: {zero: 4}"), "parallel.zero = 4: must be 0 (DDP), 1, 2 or 3"));
  CHECK(has(error_of("parallel: {zero: -1}"), "parallel.zero = -1"));
  CHECK(has(error_of("cluster: {rendezvous: {endpoint: localhost}}"),
            "cluster.rendezvous.endpoint = localhost: expected host:port"));
}

TEST_CASE("spec errors: an unknown enum name is reported once, not again by the rules using its value") {
  std::string e = error_of(kBase, {"parallel.pipeline.schedule=foo", "parallel.pipeline.virtual_stages=2"});
  CHECK(has(e, "--set parallel.pipeline.schedule=foo: parallel.pipeline.schedule = foo: must be gpipe, 1f1b, "
               "interleaved_1f1b or zb_h1"));
  CHECK(count(e, "parallel.pipeline.schedule = foo") == 1);
  CHECK(!has(e, "(it is"));  // no rule quotes a value the spec does not hold
  CHECK(has(error_of("train: {recompute: }"), "train.recompute = \"\": must be none, full or selective"));
  CHECK(has(error_of("model: {attention: [tiled]}"),
            "model.attention: expected a string, got a list; write it like attention: naive (the default)"));
}

TEST_CASE("spec errors: log.live_peak is for the CPU") {
  const std::string e = error_of("cluster: {device: cuda}\nlog: {live_peak: true}");
  CHECK(has(e, "log.live_peak = true"));
  CHECK(has(e, "t.yaml:2:"));
  CHECK(has(e, "set log.live_peak: false"));
  CHECK(error_of("cluster: {device: cpu}\nlog: {live_peak: true}") == "");
  CHECK(error_of("cluster: {device: cuda}\nlog: {live_peak: false}") == "");
}

TEST_CASE("spec errors: nccl needs cuda") {
  std::string e = error_of("cluster: {device: cpu, backend: nccl}");
  CHECK(has(e, "cluster.backend = nccl"));
  CHECK(has(e, "cluster.device = cuda"));
  CHECK(has(e, "use backend gloo"));
  CHECK(error_of("cluster: {device: cuda, backend: nccl}") == "");
}

TEST_CASE("spec errors: all problems are collected into one error") {
  std::string e = error_of(
      "job: {name: x}\n"
      "cluster: {procs_per_node: 4, device: tpu}\n"
      "parallel: {dp: 2, tp: 3, pp: 1, zero: 9}\n"
      "model: {heads: 4}\n"
      "train: {precision: fp8, micro_batch: 0}\n"
      "extra: 1\n");
  CHECK(has(e, "problems in t.yaml"));
  CHECK(has(e, "cluster.device = tpu"));
  CHECK(has(e, "parallel.tp = 3 does not divide model.heads = 4"));
  CHECK(has(e, "parallel.tp = 3 does not divide model.vocab = 256"));
  CHECK(has(e, "dp(2) * tp(3) * pp(1) = 6 != cluster.nodes(1) * cluster.procs_per_node(4) = 4"));
  CHECK(has(e, "parallel.zero = 9"));
  CHECK(has(e, "train.precision = fp8"));
  CHECK(has(e, "train.micro_batch = 0"));
  CHECK(has(e, "unknown key 'extra'"));
  CHECK(count(e, "\n  t.yaml:") == 8);
  // Listed in file order.
  CHECK(e.find("cluster.device = tpu") < e.find("parallel.zero = 9"));
  CHECK(e.find("train.micro_batch = 0") < e.find("unknown key 'extra'"));
}

TEST_CASE("spec errors: bad --set overrides") {
  CHECK(has(error_of("", {"parallel.tpp=2"}),
            "--set parallel.tpp=2: unknown key 'parallel.tpp' (did you mean parallel.tp?)"));
  CHECK(has(error_of("", {"paralel.tp=2"}), "did you mean parallel?"));
  CHECK(has(error_of("", {"parallel.tp"}), "--set parallel.tp: expected key.path=value"));
  CHECK(has(error_of("", {"=2"}), "expected key.path=value"));
  CHECK(has(error_of("", {"parallel.tp=[1"}), "--set parallel.tp=[1: parallel.tp = [1: the "
                                              "value is not valid YAML"));
  CHECK(has(error_of("", {"parallel.tp.x=1"}),
            "--set parallel.tp.x=1: cannot set parallel.tp.x: parallel.tp is a value"));
  CHECK(has(error_of("parallel: 2", {"parallel.tp=1"}),
            "cannot set parallel.tp: parallel is '2', not a section"));
  CHECK(has(error_of("", {"parallel.dp=two"}),
            "--set parallel.dp=two: parallel.dp: expected an integer, got 'two'"));
  // An override fixes what the file got wrong.
  CHECK(error_of("parallel: {dp: two}", {"parallel.dp=1"}) == "");
}

TEST_CASE("spec warnings: legal but poor choices") {
  auto w = warnings_of(kBase, {"train.grad_accum=1"});
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "train.grad_accum = 1 < parallel.pp = 2"));
  CHECK(has(w[0], "bubble"));
  CHECK(warnings_of(kBase).empty());  // grad_accum 4 >= pp 2
  w = warnings_of("parallel: {zero: 2}");
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "parallel.zero = 2 with parallel.dp = 1"));
  w = warnings_of("checkpoint: {every: 5}");
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "checkpoint.every = 5 is ignored"));
  w = warnings_of("train: {steps: 5, warmup_steps: 10}");
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "train.warmup_steps = 10 > train.steps = 5"));
}

TEST_CASE("validate_job_spec checks a spec changed in code") {
  dtrain::JobSpec s;
  s.source = "code";
  dtrain::validate_job_spec(s);
  s.parallel.tp = 3;
  s.cluster.procs_per_node = 3;
  try {
    dtrain::validate_job_spec(s);
    FAIL("expected an error");
  } catch (const dtrain::Error& e) {
    CHECK(has(e.message(), "code: parallel.tp = 3 does not divide model.heads = 4"));
  }
}

TEST_CASE("spec: the fault section (chaos testing) is checked and announced") {
  std::string e = error_of(kBase, {"fault.kind=segfault"});
  CHECK(has(e, "fault.kind"));
  CHECK(has(e, "segfault"));
  CHECK(has(e, "kill_after_step"));  // the choices are listed
  e = error_of(kBase, {"fault.kind=kill_after_step", "fault.rank=8", "fault.step=3"});
  CHECK(has(e, "fault.rank = 8"));
  CHECK(has(e, "below 8"));
  CHECK(has(error_of(kBase, {"fault.step=-1"}), "fault.step"));
  auto w = warnings_of(kBase, {"fault.kind=crash_during_save", "fault.rank=1", "fault.step=20"});
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "injects a fault on purpose"));
  CHECK(warnings_of(kBase).empty());  // none by default
}

TEST_CASE("spec: the layout faults act on every rank and say when the layout has nothing to break") {
  for (const char* kind : {"no_grad_sync", "no_tp_reduce", "no_pp_grad", "reset_moments_on_load"}) {
    CAPTURE(kind);
    CHECK(error_of(kBase, {std::string("fault.kind=") + kind, "fault.rank=9"}) == "");  // fault.rank does not apply
    auto w = warnings_of(kBase, {std::string("fault.kind=") + kind});
    REQUIRE(w.size() == 1);
    CHECK(has(w[0], "injects a fault on purpose"));
  }
  auto w = warnings_of(kBase, {"fault.kind=no_tp_reduce", "parallel.tp=1", "cluster.procs_per_node=4"});
  REQUIRE(w.size() == 2);
  CHECK(has(w[0], "fault.kind = no_tp_reduce does nothing with parallel.tp = 1"));
  w = warnings_of(kBase, {"fault.kind=no_pp_grad", "parallel.pp=1", "cluster.procs_per_node=4"});
  REQUIRE(w.size() == 2);
  CHECK(has(w[0], "fault.kind = no_pp_grad does nothing with parallel.pp = 1"));
}

TEST_CASE("spec: fault kinds hang and slow, and fault.ms") {
  CHECK(error_of(kBase, {"fault.kind=hang", "fault.rank=1", "fault.step=2"}) == "");
  CHECK(error_of(kBase, {"fault.kind=slow", "fault.rank=7", "fault.step=0", "fault.ms=250"}) == "");
  auto w = warnings_of(kBase, {"fault.kind=slow", "fault.rank=1", "fault.step=3", "fault.ms=250"});
  REQUIRE(w.size() == 1);
  CHECK(has(w[0], "fault.kind = slow (rank 1, step 3, 250 ms)"));

  // slow needs a delay; a negative one is refused whatever the kind.
  std::string e = error_of(kBase, {"fault.kind=slow", "fault.step=1"});
  CHECK(has(e, "fault.ms = 0"));
  CHECK(has(e, "set fault.ms > 0"));
  e = error_of(kBase, {"fault.kind=slow", "fault.ms=-5"});
  CHECK(has(e, "fault.ms = -5: must be >= 0"));
  CHECK(count(e, "fault.ms = ") == 1);  // reported once
  // hang and kill_after_step strike after a step: step 0 would never come.
  for (const char* kind : {"hang", "kill_after_step"}) {
    e = error_of(kBase, {std::string("fault.kind=") + kind, "fault.step=0"});
    CHECK(has(e, "fault.step = 0: fault.kind = " + std::string(kind)));
    CHECK(has(e, "use fault.step >= 1"));
  }
  CHECK(has(error_of(kBase, {"fault.kind=hang", "fault.rank=8", "fault.step=1"}), "fault.rank = 8"));
  // fault.ms on another kind is ignored, and said so.
  w = warnings_of(kBase, {"fault.kind=hang", "fault.step=1", "fault.ms=100"});
  REQUIRE(w.size() == 2);
  CHECK(has(w[0] + w[1], "fault.ms = 100 is ignored: only fault.kind = slow uses it"));
}
