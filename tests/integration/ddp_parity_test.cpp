// DDP parity (DESIGN.md sections 7 and 8): the real `dtrain launch` with 4
// Gloo ranks against a 1-process run of the same spec and global batch,
// dropout 0, fp32, 20 steps. Every step's loss must match within 1e-5
// relative and the final parameters within 1e-5 absolute; each case prints
// the max differences it saw next to the tolerance.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

using dtrain::testing::TempDir;
using dtrain::testing::free_port;
using dtrain::testing::read_params;
using dtrain::testing::word_salad;

constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 1e-5;
constexpr int kSteps = 20;

struct RunResult {
  std::vector<double> losses;      // step 1..kSteps
  std::vector<double> grad_norms;  // before clipping: catches a wrong loss scale, which
                                   // AdamW's scale invariance would hide from the losses
  std::map<std::string, std::vector<float>> params;
  std::string output;
};

// ~64 KB of deterministic word salad: learnable bytes without a data file.
std::string make_text() {
  return word_salad(64 * 1024, {"the ", "model ", "learns ", "a ", "distributed ", "gradient ",
                                "bucket ", "of ", "bytes ", "and ", "every ", "rank ", "sums ",
                                "its ", "share\n", "while ", "backward ", "runs. "});
}

// The shared tiny spec; each run changes it with --set.
std::string base_spec(const TempDir& dir) {
  return "job: {name: parity, seed: 1234}\n"
         "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
         "parallel: {dp: 1, ddp: {bucket_mb: 0.01, overlap: true}}\n"
         "model: {kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}\n"
         "train: {steps: " + std::to_string(kSteps) +
         ", micro_batch: 8, grad_accum: 1, lr: 3.0e-3, warmup_steps: 3, precision: fp32}\n"
         "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
         "log: {dir: " + (dir / "unused") + ", every: 1}\n"
         "entrypoint: builtin\n";
}

// Every record's value of `key` in a metrics.jsonl.
std::vector<double> read_metric(const std::string& path, const std::string& key) {
  std::vector<double> values;
  std::ifstream in(path);
  std::string line;
  const std::string needle = "\"" + key + "\": ";
  while (std::getline(in, line)) {
    auto at = line.find(needle);
    if (at != std::string::npos) values.push_back(std::strtod(line.c_str() + at + needle.size(), nullptr));
  }
  return values;
}

// One `dtrain launch` of the base spec with overrides; run dir <tmp>/<name>.
RunResult launch(const TempDir& dir, const std::string& name, std::vector<std::string> sets) {
  dtrain::testing::TagGuard tag;
  const std::string run_dir = dir / name;
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml"};
  sets.push_back("log.dir=" + run_dir);
  sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  auto [code, output] = dtrain::testing::run_command(
      argv, dir / (name + ".log"), 300,
      {tag.env(), "DTRAIN_DUMP_PARAMS=" + (dir / (name + ".params")), "DTRAIN_NO_REBUILD=1"});
  INFO("run " << name << " output:\n" << output);
  REQUIRE(code == 0);
  RunResult r;
  r.output = output;
  r.losses = read_metric(run_dir + "/metrics.jsonl", "loss");
  r.grad_norms = read_metric(run_dir + "/metrics.jsonl", "grad_norm");
  r.params = read_params(dir / (name + ".params"));
  REQUIRE(r.losses.size() == size_t(kSteps));
  REQUIRE(r.grad_norms.size() == size_t(kSteps));
  REQUIRE(!r.params.empty());
  return r;
}

// The fixture: one temp dir, the text, the spec, and reference runs cached
// across cases (one 1-process run per global batch size).
struct Parity {
  static Parity& get() {
    static Parity p;
    return p;
  }
  TempDir dir;
  std::map<std::string, RunResult> refs;

  Parity() {
    dtrain::testing::write_file(dir / "text.txt", make_text());
    dtrain::testing::write_file(dir / "spec.yaml", base_spec(dir));
  }
  const RunResult& reference(int gbs) {
    const std::string name = "ref_gbs" + std::to_string(gbs);
    if (!refs.count(name))
      refs[name] = launch(dir, name, {"train.micro_batch=" + std::to_string(gbs)});
    return refs[name];
  }
};

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& ref, int* worst_step) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double rel = std::fabs(a[i] - ref[i]) / std::max(std::fabs(ref[i]), 1e-12);
    if (rel > worst) worst = rel, *worst_step = int(i) + 1;
  }
  return worst;
}

void compare(const std::string& what, const RunResult& ddp, const RunResult& ref) {
  int worst_step = 0, worst_norm_step = 0;
  const double max_loss_rel = max_rel_diff(ddp.losses, ref.losses, &worst_step);
  const double max_norm_rel = max_rel_diff(ddp.grad_norms, ref.grad_norms, &worst_norm_step);
  double max_param_abs = 0;
  std::string worst_param;
  REQUIRE(ddp.params.size() == ref.params.size());
  for (auto& [name, ref_values] : ref.params) {
    auto it = ddp.params.find(name);
    REQUIRE_MESSAGE(it != ddp.params.end(), "parameter " << name << " missing from the DDP run");
    REQUIRE(it->second.size() == ref_values.size());
    for (size_t k = 0; k < ref_values.size(); ++k) {
      double d = std::fabs(double(it->second[k]) - double(ref_values[k]));
      if (d > max_param_abs) max_param_abs = d, worst_param = name;
    }
  }
  MESSAGE(what << ": loss " << ref.losses.front() << " -> " << ref.losses.back() << " over "
               << ref.losses.size() << " steps; max loss rel diff " << max_loss_rel << " (step "
               << worst_step << ", tol " << kLossRelTol << "), max grad-norm rel diff "
               << max_norm_rel << " (step " << worst_norm_step << ", tol " << kLossRelTol
               << "), max param abs diff " << max_param_abs
               << " (" << worst_param << ", tol " << kParamAbsTol << ")");
  // The runs must have trained: a parity check of two frozen models proves nothing.
  CHECK(ref.losses.back() < ref.losses.front() - 0.1);
  CHECK(max_loss_rel <= kLossRelTol);
  CHECK(max_norm_rel <= kLossRelTol);
  CHECK(max_param_abs <= kParamAbsTol);
}

// The DDP run really used 4 ranks and several buckets.
void check_layout(const RunResult& r) {
  CHECK(r.output.find("dp(4)") != std::string::npos);
  auto at = r.output.find(" bucket(s)");
  REQUIRE(at != std::string::npos);
  auto start = r.output.rfind(' ', at - 1);
  CHECK(std::atoi(r.output.c_str() + start + 1) > 1);
}

const std::vector<std::string> kFourRanks = {"cluster.procs_per_node=4", "parallel.dp=4",
                                             "train.micro_batch=2"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

}  // namespace

TEST_CASE("ddp parity: 4 ranks x micro_batch 2 vs 1 process x micro_batch 8") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  RunResult ddp = launch(p.dir, "ddp4", kFourRanks);
  check_layout(ddp);
  compare("dp4 mb2 vs dp1 mb8", ddp, ref);
}

TEST_CASE("ddp parity: grad_accum 2 (4 ranks x 2 x 2 vs 1 process x 16)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(16);
  RunResult ddp = launch(p.dir, "ddp4_ga2", with(kFourRanks, {"train.grad_accum=2"}));
  check_layout(ddp);
  compare("dp4 mb2 ga2 vs dp1 mb16", ddp, ref);
}

TEST_CASE("ddp parity: overlap off (all-reduce after backward)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  RunResult ddp = launch(p.dir, "ddp4_no_overlap", with(kFourRanks, {"parallel.ddp.overlap=false"}));
  check_layout(ddp);
  compare("dp4 mb2 overlap off vs dp1 mb8", ddp, ref);
}
