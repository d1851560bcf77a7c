// Tensor parallelism (issue 13): parity with the 1-process run (the
// harness of tests/support/parity.h: every step's loss and grad norm within
// 1e-5 relative, the merged final parameters within 1e-5) for tp 2, tp 4,
// dp 2 x tp 2, tp 2 with ZeRO-1 and ZeRO-3 over dp, and sequence
// parallelism; with dropout 0.1, every layout against the 1-process run
// with dropout 0.1 (layout-invariant masks); a tp 2 checkpoint resumed at
// tp 1 and at tp 4; bad tp values refused before any worker.
//
// Every run here, the references included, uses AdamW eps 1e-6 instead of
// 1e-8: a TP layout adds partial products in another order, and a gradient
// element that is pure rounding noise (|g| ~ 1e-9, below eps) is turned by
// Adam into an update of lr * g / eps, so its relative noise (~10%) shows
// in the parameters (4.6e-5 after 20 steps with eps 1e-8, one element of
// wte's row of a rare byte). eps 1e-6 keeps such elements from deciding the
// comparison; losses and every other element match to ~1e-7 either way.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

const std::vector<std::string> kCommon = {"train.adam_eps=1e-6"};

// Runs cached within this program (Parity::cached: by name, spec and overrides).
const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kCommon, sets));
}

// One process, micro_batch 8 (the global batch of every layout here).
const RunResult& reference(int heads) {
  return cached("ref_heads" + std::to_string(heads), {"model.heads=" + std::to_string(heads), "train.micro_batch=8"});
}

std::vector<std::string> layout(int dp, int tp, int heads) {
  return {"cluster.procs_per_node=" + std::to_string(dp * tp), "parallel.dp=" + std::to_string(dp),
          "parallel.tp=" + std::to_string(tp), "train.micro_batch=" + std::to_string(8 / dp),
          "model.heads=" + std::to_string(heads)};
}

void tp_parity(const std::string& name, int dp, int tp, int heads, const std::vector<std::string>& more = {}) {
  const RunResult& ref = reference(heads);
  const RunResult& run = cached(name, with(layout(dp, tp, heads), more));
  CHECK(run.output.find("tp(" + std::to_string(tp) + ")") != std::string::npos);
  compare(name + " vs 1 process (heads " + std::to_string(heads) + ")", run, nullptr, ref);
}

}  // namespace

TEST_CASE("tp parity: tp 2 and tp 4 on one process's batch") {
  tp_parity("tp2", 1, 2, 2);
  tp_parity("tp4", 1, 4, 4);
}

TEST_CASE("tp parity: sequence parallelism at tp 2, alone and with dp 2 x ZeRO-2; its step peak is lower") {
  tp_parity("tp2_sp", 1, 2, 2, {"parallel.sequence_parallel=true"});
  tp_parity("dp2_tp2_sp_zero2", 2, 2, 2, {"parallel.sequence_parallel=true", "parallel.zero=2"});
  cached("tp2", layout(1, 2, 2));  // the run without sequence parallelism (also a parity case above)
  const auto peak = [](const std::string& name) {
    return read_metric(Parity::get().dir / name + "/metrics.jsonl", "peak_bytes").back();
  };
  MESSAGE("tp 2 step peak: " << peak("tp2") << " B without sequence parallelism, " << peak("tp2_sp") << " B with");
  CHECK(peak("tp2_sp") < peak("tp2"));
}

TEST_CASE("tp parity: tp 2 with the embedding and head replicated (model.tp_vocab replicated)") {
  tp_parity("tp2_vocab_replicated", 1, 2, 2, {"model.tp_vocab=replicated"});
}

TEST_CASE("tp parity: dp 2 x tp 2 with DDP, ZeRO-1 and ZeRO-3") {
  tp_parity("dp2_tp2", 2, 2, 2);
  tp_parity("dp2_tp2_zero1", 2, 2, 2, {"parallel.zero=1"});
  tp_parity("dp2_tp2_zero3", 2, 2, 2, {"parallel.zero=3"});
}

TEST_CASE("dropout 0.1 draws the same masks in every layout: dp 4, dp 2 x grad_accum 2, tp 2, tp 4, dp 2 x tp 2 (DDP, ZeRO-1, ZeRO-3), tp 2 sequence-parallel") {
  const std::vector<std::string> drop = {"model.dropout=0.1"};
  const RunResult& ref = cached("ref_dropout", with(drop, {"model.heads=2", "train.micro_batch=8"}));
  // Dropout is really on: the run differs from the one without it.
  const RunResult& plain = reference(2);
  double moved = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) moved = std::max(moved, std::fabs(ref.losses[i] - plain.losses[i]));
  MESSAGE("dropout 0.1 vs 0 on one process: max loss difference " << moved);
  CHECK(moved > 1e-3);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"drop_dp4", with(layout(4, 1, 2), drop)},
      {"drop_dp2_ga2", with(layout(2, 1, 2), with(drop, {"train.micro_batch=2", "train.grad_accum=2"}))},
      {"drop_tp2", with(layout(1, 2, 2), drop)},
      {"drop_dp2_tp2_zero3", with(layout(2, 2, 2), with(drop, {"parallel.zero=3"}))},
      {"drop_tp2_sp", with(layout(1, 2, 2), with(drop, {"parallel.sequence_parallel=true"}))},
      {"drop_dp2_tp2", with(layout(2, 2, 2), drop)},
      {"drop_dp2_tp2_zero1", with(layout(2, 2, 2), with(drop, {"parallel.zero=1"}))}};
  for (const auto& [name, sets] : layouts) compare(name + " vs 1 process, dropout 0.1", cached(name, sets), nullptr, ref);
  // tp 4 needs 4 heads: its own 1-process reference.
  const RunResult& ref4 = cached("ref_dropout_heads4", with(drop, {"model.heads=4", "train.micro_batch=8"}));
  compare("drop_tp4 vs 1 process, dropout 0.1", cached("drop_tp4", with(layout(1, 4, 4), drop)), nullptr, ref4);
}

TEST_CASE("a tp 2 checkpoint resumes at tp 1 and at tp 4 within 1e-5 of the straight run") {
  auto& p = Parity::get();
  // The straight tp 2 run, with step_10 kept.
  auto [code, output] = launch_raw("tp2_straight", with(kCommon, with(layout(1, 2, 4), {"checkpoint.every=10", "checkpoint.keep=5"})));
  INFO(output);
  REQUIRE(code == 0);
  const auto want = losses_by_step(p.dir / "tp2_straight/metrics.jsonl");
  REQUIRE(want.size() == size_t(kSteps));
  const auto want_params = dtrain::testing::read_checkpoint_params(p.dir / "tp2_straight/ckpt", p.dir.path());
  for (int tp : {1, 4}) {
    const std::string name = "tp2_to_tp" + std::to_string(tp);
    auto [code2, output2] = launch_raw(name, with(kCommon, with(layout(1, tp, 4), {"checkpoint.every=0"})),
                                       {"--resume-from", p.dir / "tp2_straight/ckpt/step_10"});
    INFO(output2);
    REQUIRE(code2 == 0);
    const ResumeDiffs d = resume_diffs(name, 10, want, want_params);
    MESSAGE("tp 2 step_10 -> tp " << tp << ": max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                  << kLossRelTol << "), max param abs diff " << d.param_abs << " (tol "
                                  << kParamAbsTol << ")");
    CHECK(d.loss_rel <= kLossRelTol);
    CHECK(d.param_abs <= kParamAbsTol);
  }
}

TEST_CASE("bad tp: not dividing heads or vocab exits 2 naming the fields and the valid values") {
  auto [code, output] = launch_raw("tp3", with(kCommon, layout(1, 3, 2)));
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("parallel.tp = 3 does not divide model.heads = 2") != std::string::npos);
  CHECK(output.find("use tp 1 or 2") != std::string::npos);
  auto [code2, output2] = launch_raw("tp4_vocab", with(kCommon, with(layout(1, 4, 4), {"model.vocab=250"})));
  INFO(output2);
  CHECK(code2 == 2);
  CHECK(output2.find("parallel.tp = 4 does not divide model.vocab = 250") != std::string::npos);
}
