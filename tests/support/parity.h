// The parity harness of the numerics integration tests (docs/ARCHITECTURE.md,
// 'What counts as working' and 'The parity recipe'): the real `dtrain launch` of
// one tiny spec (dropout 0, fp32, kSteps steps) with --set overrides, a
// 1-process reference run per global batch cached across test cases, and the
// comparison of a parallel run with it: every step's loss and grad norm within
// kLossRelTol relative, the final parameters (read from the run's checkpoint
// through `dtrain ckpt merge`) within kParamAbsTol absolute, the max differences
// printed next to the tolerances, and a negative control (the same layout with
// fault.kind no_grad_sync) that must miss the reference by >= kControlFactor x
// each tolerance. Test files keep only their TEST_CASEs and layout checks.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/run_cache.h"
#include "tests/support/train_run.h"

namespace dtrain::testing::parity {

constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 1e-5;
constexpr int kSteps = 20;
constexpr double kControlFactor = 100;  // the negative control misses by at least this x tol

struct RunResult {
  std::vector<double> losses;      // step 1..kSteps
  std::vector<double> grad_norms;  // before clipping: catches a wrong loss scale, which
                                   // AdamW's scale invariance would hide from the losses
  std::vector<double> buckets_in_backward;  // per step, when the run logs it (DDP)
  std::map<std::string, std::vector<float>> params;  // the checkpoint after step kSteps
  std::string output;                                // dtrain's stdout + stderr
  std::string comm_path;  // the last record's "comm_path" object, e.g. {"dp": "shm"}
};

// ~64 KB of deterministic word salad: learnable bytes without a data file.
inline std::string make_text() {
  return word_salad(64 * 1024, {"the ", "model ", "learns ", "a ", "distributed ", "gradient ",
                                "bucket ", "of ", "bytes ", "and ", "every ", "rank ", "sums ",
                                "its ", "share\n", "while ", "backward ", "runs. "});
}

// The shared tiny spec (1 process, micro_batch 8); each run changes it with --set.
inline std::string base_spec(const TempDir& dir) {
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
inline std::vector<double> read_metric(const std::string& path, const std::string& key) {
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

// The last record's "comm_path" object of a metrics.jsonl, as written
// (each mesh axis of > 1 rank and the path of its collectives): "" if none.
inline std::string read_comm_path(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  const std::string needle = "\"comm_path\": ";
  while (std::getline(in, line)) {
    const auto at = line.find(needle);
    if (at != std::string::npos) last = line.substr(at + needle.size(), line.find('}', at) + 1 - at - needle.size());
  }
  return last;
}

// One `dtrain launch` of <dir>/spec.yaml with the overrides `sets` (applied
// after the harness's own, so they win): run dir <dir>/<name> (metrics.jsonl,
// and the checkpoint in <name>/ckpt, saved once after the last step), output
// in <dir>/<name>.log. The final parameters come from that checkpoint through
// `dtrain ckpt merge` (<dir>/<name>_ckpt.merged.safetensors).
inline RunResult launch(const TempDir& dir, const std::string& name, std::vector<std::string> sets,
                        std::vector<std::string> env = {}) {
  TagGuard tag;
  const std::string run_dir = dir / name;
  std::vector<std::string> argv = {dtrain_bin(), "launch", dir / "spec.yaml"};
  sets.insert(sets.begin(), {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt",
                             "checkpoint.every=0"});
  sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  env.insert(env.end(), {tag.env(), "DTRAIN_NO_REBUILD=1"});
  auto [code, output] = run_command(argv, dir / (name + ".log"), 300, env);
  INFO("run " << name << " output:\n" << output);
  REQUIRE(code == 0);
  RunResult r;
  r.output = output;
  r.losses = read_metric(run_dir + "/metrics.jsonl", "loss");
  r.grad_norms = read_metric(run_dir + "/metrics.jsonl", "grad_norm");
  r.buckets_in_backward = read_metric(run_dir + "/metrics.jsonl", "buckets_in_backward");
  r.comm_path = read_comm_path(run_dir + "/metrics.jsonl");
  REQUIRE(r.losses.size() == size_t(kSteps));
  REQUIRE(r.grad_norms.size() == size_t(kSteps));
  // The merge reads `latest`: it must be the checkpoint after the last step.
  REQUIRE(read_latest(run_dir + "/ckpt") == "step_" + std::to_string(kSteps));
  r.params = read_checkpoint_params(run_dir + "/ckpt", dir.path());
  REQUIRE(!r.params.empty());
  return r;
}

// The fixture: one temp dir, the text, the spec, and runs cached across
// cases by name, spec text and overrides (run_cache.h).
struct Parity {
  static Parity& get() {
    static Parity p;
    return p;
  }
  TempDir dir;
  RunCache<RunResult> runs;

  Parity() {
    write_file(dir / "text.txt", make_text());
    write_file(dir / "spec.yaml", base_spec(dir));
  }
  // launch(dir, name, sets) once; again with other sets or spec is a test bug.
  const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
    return runs.get(name, read_file(dir / "spec.yaml"), sets, [&] { return launch(dir, name, sets); });
  }
  // The 1-process run with micro_batch = gbs (grad_accum 1).
  const RunResult& reference(int gbs) {
    return cached("ref_gbs" + std::to_string(gbs), {"train.micro_batch=" + std::to_string(gbs)});
  }
};

inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& ref, int* worst_step) {
  REQUIRE(a.size() == ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double rel = std::fabs(a[i] - ref[i]) / std::max(std::fabs(ref[i]), 1e-12);
    if (rel > worst) worst = rel, *worst_step = int(i) + 1;
  }
  return worst;
}

// The largest differences of a run from the reference, and where.
struct Diffs {
  double loss_rel = 0, norm_rel = 0, param_abs = 0;
  int loss_step = 0, norm_step = 0;
  std::string param;
};

inline Diffs differences(const RunResult& run, const RunResult& ref) {
  Diffs d;
  d.loss_rel = max_rel_diff(run.losses, ref.losses, &d.loss_step);
  d.norm_rel = max_rel_diff(run.grad_norms, ref.grad_norms, &d.norm_step);
  REQUIRE(run.params.size() == ref.params.size());
  for (auto& [name, ref_values] : ref.params) {
    auto it = run.params.find(name);
    REQUIRE_MESSAGE(it != run.params.end(), "parameter " << name << " missing from the run");
    REQUIRE(it->second.size() == ref_values.size());
    for (size_t k = 0; k < ref_values.size(); ++k) {
      double diff = std::fabs(double(it->second[k]) - double(ref_values[k]));
      if (diff > d.param_abs) d.param_abs = diff, d.param = name;
    }
  }
  return d;
}

inline std::string describe(const Diffs& d) {
  std::ostringstream out;
  out << "max loss rel diff " << d.loss_rel << " (step " << d.loss_step << ", tol " << kLossRelTol
      << "), max grad-norm rel diff " << d.norm_rel << " (step " << d.norm_step << ", tol "
      << kLossRelTol << "), max param abs diff " << d.param_abs << " (" << d.param << ", tol "
      << kParamAbsTol << ")";
  return out.str();
}

// `run` must match `ref` within the tolerances; `control` (the same layout
// with a fault, `fault` saying which; nullptr when another case of the same
// layout has one) must miss it by kControlFactor x each tolerance. Prints
// both, and the control's miss factors (its difference / the tolerance).
inline void compare(const std::string& what, const RunResult& run, const RunResult* control,
                    const RunResult& ref, const std::string& fault = "no gradient sync") {
  const Diffs d = differences(run, ref);
  std::string control_line;
  Diffs c;
  if (control) {
    c = differences(*control, ref);
    std::ostringstream factors;
    factors << " (" << fault << "; miss factors: loss " << c.loss_rel / kLossRelTol << ", grad norm "
            << c.norm_rel / kLossRelTol << ", params " << c.param_abs / kParamAbsTol << "; each must be >= "
            << kControlFactor << ")";
    control_line = "\n  negative control: " + describe(c) + factors.str();
  }
  MESSAGE(what << ": loss " << ref.losses.front() << " -> " << ref.losses.back() << " over "
               << ref.losses.size() << " steps\n  parity:           " << describe(d) << control_line);
  // The runs must have trained: a parity check of two frozen models proves nothing.
  CHECK(ref.losses.back() < ref.losses.front() - 0.1);
  CHECK(d.loss_rel <= kLossRelTol);
  CHECK(d.norm_rel <= kLossRelTol);
  CHECK(d.param_abs <= kParamAbsTol);
  if (!control) return;
  CHECK(c.loss_rel >= kControlFactor * kLossRelTol);
  CHECK(c.norm_rel >= kControlFactor * kLossRelTol);
  CHECK(c.param_abs >= kControlFactor * kParamAbsTol);
}

inline void compare(const std::string& what, const RunResult& run, const RunResult& control,
                    const RunResult& ref, const std::string& fault = "no gradient sync") {
  compare(what, run, &control, ref, fault);
}

// The negative control: the same layout, every rank on its own gradient
// (run <name>_no_sync).
inline RunResult launch_without_grad_sync(const TempDir& dir, const std::string& name,
                                          std::vector<std::string> sets) {
  sets.push_back("fault.kind=no_grad_sync");
  return launch(dir, name + "_no_sync", sets);
}

// `base` followed by `more`.
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// The overrides for `dp` ranks on one node, each with micro_batch `mb`
// (global batch dp * mb * grad_accum).
inline std::vector<std::string> ranks(int dp, int mb) {
  return {"cluster.procs_per_node=" + std::to_string(dp), "parallel.dp=" + std::to_string(dp),
          "train.micro_batch=" + std::to_string(mb)};
}

// metrics.jsonl's (step, loss) records in file order (a resumed or restarted
// run appends; checkpoint records such as {"step", "ckpt_block_ms"} have no
// loss and are skipped).
inline std::vector<std::pair<int, double>> step_losses(const std::string& path) {
  std::vector<std::pair<int, double>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto s = line.find("\"step\": "), l = line.find("\"loss\": ");
    if (s != std::string::npos && l != std::string::npos)
      out.push_back({std::atoi(line.c_str() + s + 8), std::strtod(line.c_str() + l + 8, nullptr)});
  }
  return out;
}

// Every logged step's loss of a metrics.jsonl, by step (a restarted run
// logs some steps twice: the later value wins).
inline std::map<int, double> losses_by_step(const std::string& path) {
  std::map<int, double> out;
  for (auto [step, loss] : step_losses(path)) out[step] = loss;
  return out;
}

// A `dtrain launch` of the fixture's spec whose exit code and metrics the
// caller checks itself (a run meant to fail, a restart, a resume):
// run dir <dir>/<name>, checkpoint <name>/ckpt, then `sets`; extra_args
// (e.g. --resume-from DIR) after them. Returns the exit code and output.
inline std::pair<int, std::string> launch_raw(const std::string& name, std::vector<std::string> sets,
                                              std::vector<std::string> extra_args = {}) {
  auto& p = Parity::get();
  TagGuard tag;
  const std::string run_dir = p.dir / name;
  sets.insert(sets.begin(), {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt"});
  sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
  std::vector<std::string> argv = {dtrain_bin(), "launch", p.dir / "spec.yaml"};
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  return run_command(argv, p.dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
}

// Run `name` (a resume of a straight run from its step_<first>) against
// that run: the largest relative loss difference over the steps it logged
// (which must be first+1..kSteps) and the largest absolute difference of its
// final merged parameters from `want_params`.
struct ResumeDiffs {
  double loss_rel = 0, param_abs = 0;
};
inline ResumeDiffs resume_diffs(const std::string& name, int first, const std::map<int, double>& want,
                                const std::map<std::string, std::vector<float>>& want_params) {
  auto& p = Parity::get();
  ResumeDiffs d;
  const auto got = losses_by_step(p.dir / name + "/metrics.jsonl");
  REQUIRE(got.size() == size_t(kSteps - first));
  for (auto& [step, loss] : got) d.loss_rel = std::max(d.loss_rel, std::fabs(loss - want.at(step)) / want.at(step));
  const auto params = read_checkpoint_params(p.dir / name + "/ckpt", p.dir.path());
  REQUIRE(params.size() == want_params.size());
  for (auto& [pname, v] : want_params)
    for (size_t k = 0; k < v.size(); ++k)
      d.param_abs = std::max(d.param_abs, double(std::fabs(params.at(pname)[k] - v[k])));
  return d;
}

// A resume's negative control (a run resumed with fault.kind
// reset_moments_on_load, against the straight run): it must miss by
// kControlFactor x each tolerance. Prints the miss factors.
inline void check_resume_control(const std::string& what, const ResumeDiffs& d) {
  MESSAGE(what << " with fault.kind reset_moments_on_load (negative control): max loss rel diff " << d.loss_rel
               << " (miss factor " << d.loss_rel / kLossRelTol << "), max param abs diff " << d.param_abs
               << " (miss factor " << d.param_abs / kParamAbsTol << "); each must be >= " << kControlFactor);
  CHECK(d.loss_rel >= kControlFactor * kLossRelTol);
  CHECK(d.param_abs >= kControlFactor * kParamAbsTol);
}

}  // namespace dtrain::testing::parity
