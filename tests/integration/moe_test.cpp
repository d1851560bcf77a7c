// Mixture of experts with expert parallelism: parity with the 1-process run
// of the same MoE model (tests/support/parity.h: every step's loss and grad
// norm within 1e-5 relative, the merged final parameters within 1e-5) for
// ep 2 and ep 4 at dp 4 and ep 2 at dp 2 x tp 2, with a capacity that drops nothing and with
// capacity 1.0 where tokens drop, under DDP, ZeRO-1 and ZeRO-3; a negative control
// (every rank on its own gradients, the experts' included); an ep 2
// checkpoint resumed at ep 1 and ep 4 (negative control: the ep 1 resume
// with fault.kind reset_moments_on_load); the MoE metrics; bad moe fields
// refused before any worker.
//
// The 1-process reference runs the dp ranks' micro-batches one after the
// other (micro_batch 2, grad_accum 4): routing and capacity are per
// micro-batch, so it routes exactly the token groups that the dp 4 ranks do.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

const std::vector<std::string> kMoe = {"model.moe.experts=4", "model.moe.top_k=2", "train.adam_eps=1e-6"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kMoe, sets));
}

std::vector<std::string> capacity(double cf) { return {"model.moe.capacity_factor=" + std::to_string(cf)}; }

const RunResult& reference(double cf) {
  return cached("ref_cf" + std::to_string(int(cf)), with(capacity(cf), {"train.micro_batch=2", "train.grad_accum=4"}));
}

std::vector<std::string> layout(int ep, double cf) {
  return with(capacity(cf), {"cluster.procs_per_node=4", "parallel.dp=4", "parallel.ep=" + std::to_string(ep),
                             "train.micro_batch=2"});
}

std::string metrics(const std::string& name) { return Parity::get().dir / name + "/metrics.jsonl"; }

double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

}  // namespace

TEST_CASE("moe parity: ep 2 and ep 4 at dp 4, no drops (capacity_factor 4)") {
  const RunResult& ref = reference(4.0);
  for (int ep : {2, 4}) {
    const std::string name = "ep" + std::to_string(ep) + "_cf4";
    const RunResult& run = cached(name, layout(ep, 4.0));
    CHECK(run.output.find("over ep " + std::to_string(ep)) != std::string::npos);
    compare(name + " vs 1 process", run, nullptr, ref);
    CHECK(max_of(read_metric(metrics(name), "moe_dropped")) == 0.0);
  }
}

TEST_CASE("moe parity: capacity 1.0 drops tokens; ep 2 (with a negative control), ep 4, ep 2 with ZeRO-1 and ZeRO-3") {
  const RunResult& ref = reference(1.0);
  const double dropped = max_of(read_metric(metrics("ref_cf1"), "moe_dropped"));
  MESSAGE("capacity_factor 1.0: up to " << dropped * 100 << "% of the assignments of a step dropped");
  CHECK(dropped > 0.0);
  // Drops change the model: the runs differ from the no-drop reference.
  const RunResult& no_drop = reference(4.0);
  double moved = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) moved = std::max(moved, std::fabs(ref.losses[i] - no_drop.losses[i]));
  MESSAGE("capacity 1.0 vs 4.0 on one process: max loss difference " << moved);
  CHECK(moved > 1e-3);
  const RunResult& control = launch_without_grad_sync(Parity::get().dir, "ep2_cf1", with(kMoe, layout(2, 1.0)));
  // ep2_cf1 is also the straight run of the resume case below (step_10 kept).
  compare("ep2_cf1 vs 1 process", cached("ep2_cf1", with(layout(2, 1.0), {"checkpoint.every=10", "checkpoint.keep=5"})),
          &control, ref);
  compare("ep4_cf1 vs 1 process", cached("ep4_cf1", layout(4, 1.0)), nullptr, ref);
  compare("ep2_cf1_zero1 vs 1 process", cached("ep2_cf1_zero1", with(layout(2, 1.0), {"parallel.zero=1"})), nullptr,
          ref);
  // ZeRO-3 shards and gathers the dense units; the experts stay whole on their ep rank.
  compare("ep2_cf1_zero3 vs 1 process", cached("ep2_cf1_zero3", with(layout(2, 1.0), {"parallel.zero=3"})), nullptr,
          ref);
  // The step's figures, over the global batch, the same in every layout.
  for (const char* key : {"moe_aux_loss", "moe_max_load", "moe_dropped"}) {
    const auto a = read_metric(metrics("ref_cf1"), key), b = read_metric(metrics("ep4_cf1"), key);
    REQUIRE(a.size() == size_t(kSteps));
    REQUIRE(b.size() == size_t(kSteps));
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    MESSAGE(std::string(key) << ": step 1 " << a.front() << ", step 20 " << a.back() << "; ep 4 vs 1 process max diff " << d);
    CHECK(d <= 1e-5 * std::max(1.0, std::fabs(a.front())));
  }
  CHECK(read_metric(metrics("ep4_cf1"), "ep_bytes_sent").front() > 0);
}

// dp 2 x tp 2 with ep 2: the ep groups are the tp groups (Megatron's expert
// layout without expert tensor parallelism); each TP rank routes the same
// tokens and dispatches its half. grad_accum 2 keeps the reference's token
// groups of 2 samples.
TEST_CASE("moe parity: ep 2 at dp 2 x tp 2, capacity 1.0 (with a negative control); topo's tp bytes") {
  const RunResult& ref = reference(1.0);
  const std::vector<std::string> tp_layout =
      with(capacity(1.0), {"cluster.procs_per_node=4", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2",
                           "train.micro_batch=2", "train.grad_accum=2"});
  const RunResult& run = cached("dp2tp2_ep2_cf1", tp_layout);
  CHECK(run.output.find("over ep 2") != std::string::npos);
  const RunResult& control = launch_without_grad_sync(Parity::get().dir, "dp2tp2_ep2_cf1", with(kMoe, tp_layout));
  compare("dp2tp2_ep2_cf1 vs 1 process", run, &control, ref);
  // `dtrain topo` predicts the tp group's bytes (MoE blocks' all-gathers
  // included) exactly as the engine counts them.
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "topo", Parity::get().dir / "spec.yaml", "--format", "json"};
  for (const auto& s : with(kMoe, tp_layout)) argv.insert(argv.end(), {"--set", s});
  auto [code, out] = dtrain::testing::run_command(argv, Parity::get().dir / "dp2tp2_topo.log", 60);
  INFO(out);
  REQUIRE(code == 0);
  const std::string needle = "\"axis\": \"tp\"";
  const size_t at = out.find(needle);
  REQUIRE(at != std::string::npos);
  const size_t b = out.find("\"bytes_per_step\":", at);
  REQUIRE(b != std::string::npos);
  const double predicted = std::strtod(out.c_str() + b + 17, nullptr);
  const auto measured = read_metric(metrics("dp2tp2_ep2_cf1"), "tp_bytes_sent");
  REQUIRE(!measured.empty());
  MESSAGE("tp bytes per step: topo " << predicted << ", engine " << measured.front());
  CHECK(predicted == measured.front());
}

TEST_CASE("moe checkpoint: an ep 2 checkpoint resumes at ep 1 and at ep 4 within 1e-5 of the straight run") {
  auto& p = Parity::get();
  cached("ep2_cf1", with(layout(2, 1.0), {"checkpoint.every=10", "checkpoint.keep=5"}));
  const auto want = losses_by_step(metrics("ep2_cf1"));
  REQUIRE(want.size() == size_t(kSteps));
  const auto want_params = dtrain::testing::read_checkpoint_params(p.dir / "ep2_cf1/ckpt", p.dir.path());
  for (int ep : {1, 4}) {
    const std::string name = "ep2_to_ep" + std::to_string(ep);
    std::vector<std::string> args = {"--resume-from", p.dir / "ep2_cf1/ckpt/step_10"};
    if (ep == 4) args.push_back("--memory-report");
    auto [code, output] = launch_raw(name, with(kMoe, with(layout(ep, 1.0), {"checkpoint.every=0"})), args);
    INFO(output);
    REQUIRE(code == 0);
    if (ep == 4) {  // --memory-report prints the last step's ep bytes
      CHECK(output.find("bytes sent per step") != std::string::npos);
      std::ifstream in(p.dir / name + "/comm.tsv");
      std::string header;
      std::getline(in, header);
      CHECK(header == "rank\tdp_bytes\ttp_bytes\tep_bytes");
      long long rank = -1, dp = 0, tp = 0, ep_bytes = 0;
      in >> rank >> dp >> tp >> ep_bytes;
      const double logged = read_metric(metrics(name), "ep_bytes_sent").back();
      MESSAGE("--memory-report at ep 4: rank 0 sent " << ep_bytes << " ep bytes in the last step (metrics.jsonl "
                                                      << logged << "), " << dp << " dp bytes");
      CHECK(rank == 0);
      CHECK(ep_bytes > 0);
      // comm.tsv has all of the step's ep traffic: the metric's all-to-alls and,
      // after it is taken, the clip's fp64 expert norm all-reduced over ep 4
      // (2 * 3/4 * 8 bytes).
      CHECK(double(ep_bytes) == logged + 12);
    }
    const ResumeDiffs d = resume_diffs(name, 10, want, want_params);
    MESSAGE("ep 2 step_10 -> ep " << ep << ": max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                  << kLossRelTol << "), max param abs diff " << d.param_abs << " (tol "
                                  << kParamAbsTol << ")");
    CHECK(d.loss_rel <= kLossRelTol);
    CHECK(d.param_abs <= kParamAbsTol);
  }
  // The negative control: the resume at ep 1 with AdamW's moments zeroed on load.
  auto [code, output] = launch_raw("ep2_to_ep1_reset", with(kMoe, with(layout(1, 1.0), {"checkpoint.every=0",
                                                                                        "fault.kind=reset_moments_on_load"})),
                                   {"--resume-from", p.dir / "ep2_cf1/ckpt/step_10"});
  INFO(output);
  REQUIRE(code == 0);
  check_resume_control("ep 2 step_10 -> ep 1", resume_diffs("ep2_to_ep1_reset", 10, want, want_params));
}

TEST_CASE("bad moe: ep with a dense model, experts % ep, top_k > experts, tokens over tp exit 2 naming the field") {
  auto [code, output] = launch_raw("ep2_dense", with(layout(2, 1.0), {"model.moe.experts=0"}));
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("model.moe.experts = 0 (a dense model) with parallel.ep = 2") != std::string::npos);
  auto [code2, output2] = launch_raw("ep4_e6", with(kMoe, with(layout(4, 1.0), {"model.moe.experts=6"})));
  INFO(output2);
  CHECK(code2 == 2);
  CHECK(output2.find("model.moe.experts = 6 is not divisible by parallel.ep = 4") != std::string::npos);
  auto [code3, output3] = launch_raw("topk5", with(kMoe, {"model.moe.top_k=5"}));
  INFO(output3);
  CHECK(code3 == 2);
  CHECK(output3.find("model.moe.top_k = 5: must be in [1, model.moe.experts = 4]") != std::string::npos);
  // Under tp: a micro-batch whose tokens do not split over tp.
  auto [code5, output5] =
      launch_raw("tp2_33", with(kMoe, {"cluster.procs_per_node=2", "parallel.tp=2", "train.micro_batch=1",
                                       "model.seq_len=33"}));
  INFO(output5);
  CHECK(code5 == 2);
  CHECK(output5.find("train.micro_batch * model.seq_len = 33 tokens do not split over parallel.tp = 2") !=
        std::string::npos);
}
