// DDP parity (DESIGN.md sections 7 and 8): the real `dtrain launch` with 4
// Gloo ranks against a 1-process run of the same spec and global batch,
// dropout 0, fp32, 20 steps. Every step's loss must match within 1e-5
// relative and the final parameters within 1e-5 absolute; each case prints
// the max differences it saw next to the tolerance, and beside them a
// negative control: the same DDP run with gradient synchronisation disabled
// (the spec's fault.kind no_grad_sync) must miss the reference by >= 100x the
// tolerance, or the comparison could not tell right from wrong.
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
#include <sstream>
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
constexpr double kControlFactor = 100;  // the negative control misses by at least this x tol

struct RunResult {
  std::vector<double> losses;      // step 1..kSteps
  std::vector<double> grad_norms;  // before clipping: catches a wrong loss scale, which
                                   // AdamW's scale invariance would hide from the losses
  std::vector<double> buckets_in_backward;  // per step: all-reduces the hooks started
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
RunResult launch(const TempDir& dir, const std::string& name, std::vector<std::string> sets,
                 std::vector<std::string> env = {}) {
  dtrain::testing::TagGuard tag;
  const std::string run_dir = dir / name;
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml"};
  sets.push_back("log.dir=" + run_dir);
  sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  env.insert(env.end(),
             {tag.env(), "DTRAIN_DUMP_PARAMS=" + (dir / (name + ".params")), "DTRAIN_NO_REBUILD=1"});
  auto [code, output] = dtrain::testing::run_command(argv, dir / (name + ".log"), 300, env);
  INFO("run " << name << " output:\n" << output);
  REQUIRE(code == 0);
  RunResult r;
  r.output = output;
  r.losses = read_metric(run_dir + "/metrics.jsonl", "loss");
  r.grad_norms = read_metric(run_dir + "/metrics.jsonl", "grad_norm");
  r.buckets_in_backward = read_metric(run_dir + "/metrics.jsonl", "buckets_in_backward");
  r.params = read_params(dir / (name + ".params"));
  REQUIRE(r.losses.size() == size_t(kSteps));
  REQUIRE(r.grad_norms.size() == size_t(kSteps));
  REQUIRE(r.buckets_in_backward.size() == size_t(kSteps));
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

struct Diffs {
  double loss_rel = 0, norm_rel = 0, param_abs = 0;
  int loss_step = 0, norm_step = 0;
  std::string param;
};

Diffs differences(const RunResult& ddp, const RunResult& ref) {
  Diffs d;
  d.loss_rel = max_rel_diff(ddp.losses, ref.losses, &d.loss_step);
  d.norm_rel = max_rel_diff(ddp.grad_norms, ref.grad_norms, &d.norm_step);
  REQUIRE(ddp.params.size() == ref.params.size());
  for (auto& [name, ref_values] : ref.params) {
    auto it = ddp.params.find(name);
    REQUIRE_MESSAGE(it != ddp.params.end(), "parameter " << name << " missing from the DDP run");
    REQUIRE(it->second.size() == ref_values.size());
    for (size_t k = 0; k < ref_values.size(); ++k) {
      double diff = std::fabs(double(it->second[k]) - double(ref_values[k]));
      if (diff > d.param_abs) d.param_abs = diff, d.param = name;
    }
  }
  return d;
}

std::string describe(const Diffs& d) {
  std::ostringstream out;
  out << "max loss rel diff " << d.loss_rel << " (step " << d.loss_step << ", tol " << kLossRelTol
      << "), max grad-norm rel diff " << d.norm_rel << " (step " << d.norm_step << ", tol "
      << kLossRelTol << "), max param abs diff " << d.param_abs << " (" << d.param << ", tol "
      << kParamAbsTol << ")";
  return out.str();
}

// `ddp` must match `ref` within the tolerances; `control` (the same layout
// with a fault) must miss it by kControlFactor x each tolerance.
void compare(const std::string& what, const RunResult& ddp, const RunResult& control,
             const RunResult& ref) {
  const Diffs d = differences(ddp, ref);
  const Diffs c = differences(control, ref);
  MESSAGE(what << ": loss " << ref.losses.front() << " -> " << ref.losses.back() << " over "
               << ref.losses.size() << " steps\n  parity:           " << describe(d)
               << "\n  negative control: " << describe(c) << " (each must be >= " << kControlFactor
               << " x tol: no gradient sync)");
  // The runs must have trained: a parity check of two frozen models proves nothing.
  CHECK(ref.losses.back() < ref.losses.front() - 0.1);
  CHECK(d.loss_rel <= kLossRelTol);
  CHECK(d.norm_rel <= kLossRelTol);
  CHECK(d.param_abs <= kParamAbsTol);
  CHECK(c.loss_rel >= kControlFactor * kLossRelTol);
  CHECK(c.norm_rel >= kControlFactor * kLossRelTol);
  CHECK(c.param_abs >= kControlFactor * kParamAbsTol);
}

// The negative control: the same layout, every rank on its own gradient.
RunResult launch_without_grad_sync(const TempDir& dir, const std::string& name,
                                   const std::vector<std::string>& sets) {
  std::vector<std::string> faulty = sets;
  faulty.push_back("fault.kind=no_grad_sync");
  return launch(dir, name + "_no_sync", faulty);
}

// The DDP run really used 4 ranks and several buckets, and launched them
// from the backward hooks in every step (overlap on) or in none (off).
void check_layout(const RunResult& r, bool overlap) {
  CHECK(r.output.find("dp(4)") != std::string::npos);
  auto at = r.output.find(" bucket(s)");
  REQUIRE(at != std::string::npos);
  auto start = r.output.rfind(' ', at - 1);
  const int buckets = std::atoi(r.output.c_str() + start + 1);
  CHECK(buckets > 1);
  const auto [lo, hi] = std::minmax_element(r.buckets_in_backward.begin(), r.buckets_in_backward.end());
  const std::string mode = overlap ? "on" : "off";
  MESSAGE("buckets launched in backward per step: " << *lo << " to " << *hi << " of " << buckets
                                                    << " (overlap " << mode << ")");
  if (overlap)
    CHECK(*lo > 0);
  else
    CHECK(*hi == 0);
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
  check_layout(ddp, true);
  compare("dp4 mb2 vs dp1 mb8", ddp, launch_without_grad_sync(p.dir, "ddp4", kFourRanks), ref);
}

TEST_CASE("ddp parity: grad_accum 2 (4 ranks x 2 x 2 vs 1 process x 16)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(16);
  const auto sets = with(kFourRanks, {"train.grad_accum=2"});
  RunResult ddp = launch(p.dir, "ddp4_ga2", sets);
  check_layout(ddp, true);
  compare("dp4 mb2 ga2 vs dp1 mb16", ddp, launch_without_grad_sync(p.dir, "ddp4_ga2", sets), ref);
}

TEST_CASE("ddp parity: overlap off (all-reduce after backward)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  const auto sets = with(kFourRanks, {"parallel.ddp.overlap=false"});
  RunResult ddp = launch(p.dir, "ddp4_no_overlap", sets);
  check_layout(ddp, false);
  compare("dp4 mb2 overlap off vs dp1 mb8", ddp,
          launch_without_grad_sync(p.dir, "ddp4_no_overlap", sets), ref);
}
