// Job spec loading: defaults, every section parsed, overrides (--set), YAML and
// JSON round trips, and the shipped configs. Errors live in
// job_spec_errors_test.cpp.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/job_spec.h"

using dtrain::JobSpec;
using dtrain::parse_job_spec;

namespace {

void check_same(const JobSpec& a, const JobSpec& b) {
  // Printing covers every field, so equal text means equal specs.
  CHECK(dtrain::job_spec_to_yaml(a) == dtrain::job_spec_to_yaml(b));
  CHECK(dtrain::job_spec_to_json(a) == dtrain::job_spec_to_json(b));
}

const char* kFull = R"(
job: {name: full, seed: 42}
cluster:
  nodes: "2:4"
  procs_per_node: 2
  device: cuda
  backend: nccl
  max_restarts: 3
  grace_s: 7.5
  rendezvous: {endpoint: "node0:1234", join_timeout_s: 30, last_call_s: 1.5, heartbeat_s: 0.5,
               token_file: /etc/dtrain/token}
  topology: {nvlink_domain: 4}
parallel:
  dp: 2
  tp: 2
  pp: 2
  ep: 2
  zero: 2
  pipeline: {schedule: gpipe}
  ddp: {bucket_mb: 12.5, overlap: false}
model: {kind: gpt, vocab: 512, layers: 6, d_model: 96, heads: 6, seq_len: 32, dropout: 0.1,
        moe: {experts: 4, top_k: 2, capacity_factor: 1.5, aux_loss_coef: 0.02, every: 2, balance: bias,
              bias_rate: 0.01}}
train: {steps: 7, micro_batch: 3, grad_accum: 5, lr: 1.0e-3, min_lr: 1.0e-5, warmup_steps: 2,
        weight_decay: 0.01, beta1: 0.8, beta2: 0.99, grad_clip: 0, precision: bf16}
data: {path: /data/tokens.bin, format: tokens-u16}
checkpoint: {dir: ck, every: 3, keep: 1}
log: {dir: logs, every: 2}
entrypoint: [python3, "train.py", --flag]
)";

}  // namespace

TEST_CASE("job spec: an empty document gives the defaults") {
  for (const char* text : {"", "# only a comment\n", "{}"}) {
    std::vector<std::string> warnings;
    JobSpec s = parse_job_spec(text, "empty.yaml", {}, &warnings);
    JobSpec d;
    d.source = "empty.yaml";
    check_same(s, d);
    CHECK(s.builtin_entrypoint());
    CHECK(s.world() == 1);
    CHECK(s.cluster.nodes_min == 1);
    CHECK(warnings.empty());
  }
}

TEST_CASE("job spec: every field of every section is read") {
  JobSpec s = parse_job_spec(kFull, "full.yaml");
  CHECK(s.job.name == "full");
  CHECK(s.job.seed == 42);
  CHECK(s.cluster.nodes_min == 2);
  CHECK(s.cluster.nodes_max == 4);
  CHECK(s.cluster.procs_per_node == 2);
  CHECK(s.cluster.device == dtrain::DeviceKind::cuda);
  CHECK(s.cluster.backend == dtrain::CommBackend::nccl);
  CHECK(s.cluster.max_restarts == 3);
  CHECK(s.cluster.grace_s == 7.5);
  CHECK(s.cluster.rendezvous.endpoint == "node0:1234");
  CHECK(s.cluster.rendezvous.join_timeout_s == 30);
  CHECK(s.cluster.rendezvous.last_call_s == 1.5);
  CHECK(s.cluster.rendezvous.heartbeat_s == 0.5);
  CHECK(s.cluster.rendezvous.token_file == "/etc/dtrain/token");
  CHECK(s.cluster.topology.nvlink_domain == 4);
  CHECK(s.parallel.dp == 2);
  CHECK(s.parallel.tp == 2);
  CHECK(s.parallel.pp == 2);
  CHECK(s.parallel.ep == 2);
  CHECK(s.parallel.zero == 2);
  CHECK(s.parallel.pipeline_schedule == dtrain::PipelineSchedule::gpipe);
  CHECK(s.parallel.ddp_bucket_mb == 12.5);
  CHECK(s.parallel.ddp_overlap == false);
  CHECK(s.model.vocab == 512);
  CHECK(s.model.layers == 6);
  CHECK(s.model.d_model == 96);
  CHECK(s.model.heads == 6);
  CHECK(s.model.seq_len == 32);
  CHECK(s.model.dropout == 0.1);
  CHECK(s.train.steps == 7);
  CHECK(s.train.micro_batch == 3);
  CHECK(s.train.grad_accum == 5);
  CHECK(s.train.lr == 1.0e-3);
  CHECK(s.train.min_lr == 1.0e-5);
  CHECK(s.train.warmup_steps == 2);
  CHECK(s.train.weight_decay == 0.01);
  CHECK(s.train.beta1 == 0.8);
  CHECK(s.train.beta2 == 0.99);
  CHECK(s.train.grad_clip == 0.0);
  CHECK(s.train.precision == dtrain::Precision::bf16);
  CHECK(s.data.path == "/data/tokens.bin");
  CHECK(s.data.format == dtrain::DataFormat::tokens_u16);
  CHECK(s.checkpoint.dir == "ck");
  CHECK(s.checkpoint.every == 3);
  CHECK(s.checkpoint.keep == 1);
  CHECK(s.log.dir == "logs");
  CHECK(s.log.every == 2);
  CHECK(s.entrypoint == std::vector<std::string>{"python3", "train.py", "--flag"});
  CHECK(s.source == "full.yaml");
  // Derived values.
  CHECK(s.world() == 8);
  CHECK(s.global_batch() == 3 * 5 * 2);
  CHECK(s.tokens_per_step() == 30 * 32);
}

TEST_CASE("job spec: nodes as an int, a quoted int and an elastic range") {
  CHECK(parse_job_spec("cluster: {nodes: 1}", "a").cluster.nodes_max == 1);
  JobSpec s = parse_job_spec("cluster: {nodes: \"1\"}", "a");
  CHECK(s.cluster.nodes_min == 1);
  s = parse_job_spec("cluster: {nodes: 1:4, procs_per_node: 2}\nparallel: {dp: 8}", "a");
  CHECK(s.cluster.nodes_min == 1);
  CHECK(s.cluster.nodes_max == 4);
}

TEST_CASE("job spec: entrypoint as builtin, a command string, or a list") {
  CHECK(parse_job_spec("entrypoint: builtin", "a").builtin_entrypoint());
  CHECK(parse_job_spec("entrypoint: python3  train.py --x 1", "a").entrypoint ==
        std::vector<std::string>{"python3", "train.py", "--x", "1"});
  CHECK(parse_job_spec("entrypoint: [bash, -c, 'echo a b']", "a").entrypoint ==
        std::vector<std::string>{"bash", "-c", "echo a b"});
}

TEST_CASE("job spec: --set overrides are read as YAML") {
  std::string text = "cluster: {procs_per_node: 4}\nparallel: {dp: 4}\n";
  JobSpec s = parse_job_spec(text, "a.yaml", {"parallel.dp=2", "parallel.tp=2"});
  CHECK(s.parallel.dp == 2);
  CHECK(s.parallel.tp == 2);
  s = parse_job_spec(text, "a.yaml", {"entrypoint=[python3, train.py]"});
  CHECK(s.entrypoint == std::vector<std::string>{"python3", "train.py"});
  // A section that the file does not have is created.
  s = parse_job_spec(text, "a.yaml", {"cluster.rendezvous.endpoint=h:1", "train.lr=1e-3"});
  CHECK(s.cluster.rendezvous.endpoint == "h:1");
  CHECK(s.train.lr == 1e-3);
  // A whole section as a flow mapping; later overrides win.
  s = parse_job_spec(text, "a.yaml", {"model={layers: 4, heads: 2}", "model.layers=8"});
  CHECK(s.model.layers == 8);
  CHECK(s.model.heads == 2);
  // Overrides on an empty document.
  s = parse_job_spec("", "a.yaml", {"job.name=x", "parallel.ddp.overlap=false"});
  CHECK(s.job.name == "x");
  CHECK(s.parallel.ddp_overlap == false);
}

TEST_CASE("job spec: YAML and JSON round trips keep every field") {
  JobSpec full = parse_job_spec(kFull, "full.yaml");
  for (const JobSpec& s : {full, JobSpec{}}) {
    std::string yaml = dtrain::job_spec_to_yaml(s);
    JobSpec again = parse_job_spec(yaml, s.source);
    check_same(s, again);
    std::string json = dtrain::job_spec_to_json(s);
    JobSpec from_json = parse_job_spec(json, s.source);  // JSON is YAML
    check_same(s, from_json);
  }
  // Awkward strings survive.
  JobSpec odd;
  odd.job.name = "a: b, #c";
  odd.data.path = "";
  odd.log.dir = "true";
  odd.entrypoint = {"sh", "-c", "echo [1, 2]: x"};
  odd.train.lr = 0.1 + 0.2;  // needs 17 digits
  check_same(odd, parse_job_spec(dtrain::job_spec_to_yaml(odd), ""));
  check_same(odd, parse_job_spec(dtrain::job_spec_to_json(odd), ""));
  CHECK(parse_job_spec(dtrain::job_spec_to_yaml(odd), "").train.lr == 0.1 + 0.2);
}

TEST_CASE("job spec: load_job_spec reads a file, and round-trips through one") {
  char dir[] = "/tmp/dtrain-spec-unit-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/roundtrip.yaml";
  JobSpec full = parse_job_spec(kFull, "full.yaml");
  {
    std::ofstream out(path);
    out << dtrain::job_spec_to_yaml(full);
  }
  JobSpec loaded = dtrain::load_job_spec(path);
  std::filesystem::remove_all(dir);
  CHECK(loaded.source == path);
  loaded.source = full.source;
  check_same(full, loaded);
}

TEST_CASE("job spec: the shipped configs load") {
  std::string dir = std::string(DTRAIN_SOURCE_DIR) + "/configs/";
  std::vector<std::string> warnings;
  JobSpec q = dtrain::load_job_spec(dir + "quickstart.yaml", {}, &warnings);
  CHECK(q.world() == 4);
  CHECK(q.parallel.dp == 4);
  CHECK(q.cluster.procs_per_node == 4);
  CHECK(q.cluster.device == dtrain::DeviceKind::cpu);
  JobSpec g = dtrain::load_job_spec(dir + "gpt-3d.yaml", {}, &warnings);
  CHECK(g.world() == 8);
  CHECK(g.parallel.tp == 2);
  CHECK(g.parallel.pp == 2);
  CHECK(warnings.empty());
}

TEST_CASE("job spec: summary prints the derived values") {
  JobSpec s = parse_job_spec(kFull, "full.yaml");
  std::string sum = dtrain::job_spec_summary(s);
  CHECK(sum.find("world = dp(2) x tp(2) x pp(2) = 8") != std::string::npos);
  CHECK(sum.find("GBS = micro_batch(3) x grad_accum(5) x dp(2) = 30") != std::string::npos);
  CHECK(sum.find("ranks per node = 2") != std::string::npos);
  CHECK(sum.find("tokens per step = GBS(30) x seq_len(32) = 960") != std::string::npos);
}
