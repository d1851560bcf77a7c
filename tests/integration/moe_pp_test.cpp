// Mixture of experts under pipeline and sequence parallelism: parity with the
// 1-process run of the same MoE model (tests/support/parity.h: every step's
// loss and grad norm within 1e-5 relative, the merged final parameters within
// 1e-5, max differences printed) for dp 2 x ep 2 x pp 2 with 1f1b and zb_h1
// (split backward) at capacity 1.0 (tokens drop) and 4.0, and for tp 2 with
// sequence parallelism (ep 2 over the tp ranks); the routing figures reduced
// over pp; a pp 2 checkpoint resumed at pp 1.
// Negative controls: zeros for the gradients sent back between stages
// (fault.kind no_pp_grad), the row-parallel layers without their tp
// reduction (no_tp_reduce), the resume with reset_moments_on_load.
//
// The 1-process reference runs micro-batches of 2 samples, 4 per step: routing
// and capacity are per micro-batch, so it routes the token groups that the
// parallel runs' micro-batches hold. The aux loss coefficient is 0.1 (10x
// the default) so that the aux loss's share of the gradient is large.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

const std::vector<std::string> kMoe = {"model.moe.experts=4", "model.moe.top_k=2", "model.moe.aux_loss_coef=0.1",
                                       "train.adam_eps=1e-6"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kMoe, sets));
}

std::vector<std::string> capacity(double cf) { return {"model.moe.capacity_factor=" + std::to_string(cf)}; }

const RunResult& reference(double cf) {
  return cached("ref_cf" + std::to_string(int(cf)), with(capacity(cf), {"train.micro_batch=2", "train.grad_accum=4"}));
}

// dp 2 x pp 2 with ep 2 inside each stage, 2 micro-batches of 2 samples per rank.
std::vector<std::string> pp_layout(const std::string& schedule, double cf) {
  return with(capacity(cf), {"cluster.procs_per_node=4", "parallel.dp=2", "parallel.ep=2", "parallel.pp=2",
                             "train.micro_batch=2", "train.grad_accum=2", "parallel.pipeline.schedule=" + schedule});
}

// tp 2 with sequence parallelism, ep 2 over the tp ranks.
std::vector<std::string> sp_layout() {
  return with(capacity(1.0), {"cluster.procs_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                              "parallel.ep=2", "train.micro_batch=2", "train.grad_accum=4"});
}

std::string metrics(const std::string& name) { return Parity::get().dir / name + "/metrics.jsonl"; }

// The largest difference of a metric between two runs, every step present in both.
double metric_diff(const std::string& a_run, const std::string& b_run, const std::string& key, double* first) {
  const auto a = read_metric(metrics(a_run), key), b = read_metric(metrics(b_run), key);
  REQUIRE(a.size() == size_t(kSteps));
  REQUIRE(b.size() == size_t(kSteps));
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  *first = a.front();
  return d;
}

// `dtrain topo --format json`'s bytes_per_step of the first group of `axis`.
double topo_bytes(const std::vector<std::string>& sets, const std::string& axis) {
  auto& p = Parity::get();
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "topo", p.dir / "spec.yaml", "--format", "json"};
  for (const auto& s : with(kMoe, sets)) argv.insert(argv.end(), {"--set", s});
  auto [code, out] = dtrain::testing::run_command(argv, p.dir / ("topo_" + axis + ".log"), 60);
  INFO(out);
  REQUIRE(code == 0);
  const size_t at = out.find("\"axis\": \"" + axis + "\"");
  REQUIRE(at != std::string::npos);
  const size_t b = out.find("\"bytes_per_step\":", at);
  REQUIRE(b != std::string::npos);
  return std::strtod(out.c_str() + b + 17, nullptr);
}

}  // namespace

TEST_CASE("moe under pp: dp 2 x ep 2 x pp 2, 1f1b and zb_h1, capacity 1.0 (with a negative control) and 4.0") {
  const RunResult& ref = reference(1.0);
  // pp_1f1b_cf1 is also the straight run of the resume case below (step_10 kept).
  const RunResult& run = cached("pp_1f1b_cf1", with(pp_layout("1f1b", 1.0), {"checkpoint.every=10", "checkpoint.keep=5"}));
  CHECK(run.output.find("pp(2)") != std::string::npos);
  CHECK(run.output.find("over ep 2") != std::string::npos);
  compare("pp_1f1b_cf1 vs 1 process", run, nullptr, ref);
  const RunResult& control = cached("pp_zb_h1_cf1_no_pp_grad", with(pp_layout("zb_h1", 1.0), {"fault.kind=no_pp_grad"}));
  CHECK(control.output.find("fault.kind = no_pp_grad") != std::string::npos);
  compare("pp_zb_h1_cf1 vs 1 process", cached("pp_zb_h1_cf1", pp_layout("zb_h1", 1.0)), &control, ref,
          "fault.kind no_pp_grad");
  const RunResult& ref4 = reference(4.0);
  compare("pp_1f1b_cf4 vs 1 process", cached("pp_1f1b_cf4", pp_layout("1f1b", 4.0)), nullptr, ref4);
  compare("pp_zb_h1_cf4 vs 1 process", cached("pp_zb_h1_cf4", pp_layout("zb_h1", 4.0)), nullptr, ref4);
  // The routing figures, summed over the stages (each holds one MoE block),
  // equal the 1-process run's.
  for (const char* key : {"moe_aux_loss", "moe_max_load", "moe_dropped"}) {
    double first = 0;
    const double d = metric_diff("ref_cf1", "pp_1f1b_cf1", key, &first);
    MESSAGE(std::string(key) << ": step 1 " << first << "; pp 2 vs 1 process max diff " << d);
    CHECK(d <= 1e-5 * std::max(1.0, std::fabs(first)));
  }
  double dropped = 0;
  for (double x : read_metric(metrics("pp_1f1b_cf1"), "moe_dropped")) dropped = std::max(dropped, x);
  MESSAGE("capacity_factor 1.0 at pp 2: up to " << dropped * 100 << "% of a step's assignments dropped");
  CHECK(dropped > 0.0);
  CHECK(read_metric(metrics("pp_1f1b_cf4"), "moe_dropped").back() == 0.0);
  // topo's ep bytes assume uniform routing; the engine counts the routing's.
  const double ep_topo = topo_bytes(pp_layout("1f1b", 1.0), "ep");
  const auto ep_engine = read_metric(metrics("pp_1f1b_cf1"), "ep_bytes_sent");
  MESSAGE("ep bytes per step at pp 2 (rank 0's pp group): topo " << ep_topo << " per stage, engine step 1 "
                                                                 << ep_engine.front() << ", step 20 " << ep_engine.back());
  CHECK(ep_engine.front() > 0);
}

TEST_CASE("moe with sequence parallelism: tp 2 (ep 2 over it) routes the gathered micro-batch (with a negative control)") {
  const RunResult& ref = reference(1.0);
  const RunResult& run = cached("tp2_sp_cf1", sp_layout());
  CHECK(run.output.find("over ep 2") != std::string::npos);
  const RunResult& control = cached("tp2_sp_cf1_no_tp_reduce", with(sp_layout(), {"fault.kind=no_tp_reduce"}));
  compare("tp2_sp_cf1 vs 1 process", run, &control, ref, "fault.kind no_tp_reduce");
  double first = 0;
  const double d = metric_diff("ref_cf1", "tp2_sp_cf1", "moe_dropped", &first);
  MESSAGE("moe_dropped: step 1 " << first << "; tp 2 with SP vs 1 process max diff " << d);
  CHECK(d <= 1e-5);
  // `dtrain topo`'s tp bytes (the MoE blocks' position gathers included)
  // beside the engine's; topo leaves out the once-a-step all-reduce of the
  // SP region's replicated gradients (LayerNorms, wpe, biases), dense or not.
  const double predicted = topo_bytes(sp_layout(), "tp");
  const auto measured = read_metric(metrics("tp2_sp_cf1"), "tp_bytes_sent");
  REQUIRE(!measured.empty());
  MESSAGE("tp bytes per step with SP: topo " << predicted << ", engine " << measured.front());
}

TEST_CASE("moe checkpoint: a pp 2 checkpoint resumes at pp 1 within 1e-5 of the straight run") {
  auto& p = Parity::get();
  cached("pp_1f1b_cf1", with(pp_layout("1f1b", 1.0), {"checkpoint.every=10", "checkpoint.keep=5"}));
  const auto want = losses_by_step(metrics("pp_1f1b_cf1"));
  REQUIRE(want.size() == size_t(kSteps));
  const auto want_params = dtrain::testing::read_checkpoint_params(p.dir / "pp_1f1b_cf1/ckpt", p.dir.path());
  const std::vector<std::string> one = with(kMoe, with(capacity(1.0), {"train.micro_batch=2", "train.grad_accum=4",
                                                                       "checkpoint.every=0"}));
  const std::vector<std::string> from = {"--resume-from", p.dir / "pp_1f1b_cf1/ckpt/step_10"};
  auto [code, output] = launch_raw("pp2_to_pp1", one, from);
  INFO(output);
  REQUIRE(code == 0);
  const ResumeDiffs d = resume_diffs("pp2_to_pp1", 10, want, want_params);
  MESSAGE("pp 2 step_10 -> pp 1: max loss rel diff " << d.loss_rel << " over steps 11-20 (tol " << kLossRelTol
                                                     << "), max param abs diff " << d.param_abs << " (tol "
                                                     << kParamAbsTol << ")");
  CHECK(d.loss_rel <= kLossRelTol);
  CHECK(d.param_abs <= kParamAbsTol);
  auto [code2, output2] = launch_raw("pp2_to_pp1_reset", with(one, {"fault.kind=reset_moments_on_load"}), from);
  INFO(output2);
  REQUIRE(code2 == 0);
  check_resume_control("pp 2 step_10 -> pp 1", resume_diffs("pp2_to_pp1_reset", 10, want, want_params));
}
