// Pipeline parallelism: parity with the 1-process run of the same
// global batch (8 samples), fp32, dropout 0.1 (layout-invariant masks), 20
// steps, through the harness of tests/support/parity.h (losses and grad
// norms within 1e-5 relative, merged final parameters within 1e-5, max
// differences printed): pp 2 with 1f1b at m = 1 and 4 and gpipe at m = 4,
// pp 4 with 1f1b at m = 8, and dp 2 x tp 2 x pp 2 on 8 ranks; a 2x2x2
// checkpoint resumed on one process; uneven stages (layers_per_stage); the
// zero-bubble zb_h1 schedule (split backward); each rank's logged mesh
// coordinates against `dtrain topo --format json`. AdamW eps 1e-6 as in
// tp_test.cpp. Negative controls: pp 2 1f1b m 4 with fault.kind no_pp_grad
// (the gradients sent back between stages are zeros), the resume on 1x1x1
// with reset_moments_on_load.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using namespace dtrain::testing::parity;

const std::vector<std::string> kCommon = {"train.adam_eps=1e-6", "model.dropout=0.1", "model.layers=4"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kCommon, sets));
}

const RunResult& reference() { return cached("pp_ref", {"train.micro_batch=8"}); }

// dp x tp x pp ranks, m micro-batches per step, global batch 8.
std::vector<std::string> layout(int dp, int tp, int pp, int m, const std::string& schedule) {
  return {"cluster.procs_per_node=" + std::to_string(dp * tp * pp), "parallel.dp=" + std::to_string(dp),
          "parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
          "train.micro_batch=" + std::to_string(8 / (dp * m)), "train.grad_accum=" + std::to_string(m),
          "parallel.pipeline.schedule=" + schedule};
}

void pp_parity(const std::string& name, const std::vector<std::string>& sets, int pp, bool with_control = false) {
  const RunResult& run = cached(name, sets);
  CHECK(run.output.find("pp(" + std::to_string(pp) + ")") != std::string::npos);
  CHECK(run.output.find("pipeline plan") != std::string::npos);
  if (!with_control) return compare(name + " vs 1 process", run, nullptr, reference());
  const RunResult& control = cached(name + "_no_pp_grad", with(sets, {"fault.kind=no_pp_grad"}));
  CHECK(control.output.find("fault.kind = no_pp_grad") != std::string::npos);
  compare(name + " vs 1 process", run, &control, reference(), "fault.kind no_pp_grad");
}

// Each rank's engine logs "rank R coordinates dp=..,tp=..,pp=..,ep=.." into
// <run>/rank_R.log; `dtrain topo --format json` of the same spec and sets
// must place every rank at exactly those coordinates.
void check_coordinates_match_topo(const std::string& name, const std::vector<std::string>& sets, int world) {
  auto& p = Parity::get();
  std::vector<std::string> argv = {"topo", p.dir / "spec.yaml", "--format", "json"};
  for (const auto& s : with(kCommon, sets)) argv.insert(argv.end(), {"--set", s});
  argv.insert(argv.begin(), dtrain_bin());
  auto [code, out] = run_command(argv, p.dir / (name + "_topo.log"));
  INFO(out);
  REQUIRE(code == 0);
  const auto j = nlohmann::json::parse(out.substr(out.find('{'), out.rfind('}') - out.find('{') + 1));
  REQUIRE(j["ranks"].size() == size_t(world));
  int matched = 0;
  for (const auto& r : j["ranks"]) {
    const int rank = r["rank"];
    const std::string want = "rank " + std::to_string(rank) + " coordinates dp=" + std::to_string(int(r["dp"])) +
                             ",tp=" + std::to_string(int(r["tp"])) + ",pp=" + std::to_string(int(r["pp"])) +
                             ",ep=" + std::to_string(int(r["ep"]));
    const std::string log = read_file(p.dir / (name + "/rank_" + std::to_string(rank) + ".log"));
    INFO("rank " << rank << " log:\n" << log.substr(0, 2000));
    CHECK(log.find(want) != std::string::npos);
    matched += log.find(want) != std::string::npos;
  }
  MESSAGE(name << ": " << matched << " of " << world << " ranks logged the coordinates dtrain topo gives them");
}

}  // namespace

TEST_CASE("pp parity: pp 2 with 1f1b (m 1, 4; m 4 with a negative control) and gpipe (m 4), pp 4 with 1f1b (m 8)") {
  pp_parity("pp2_1f1b_m1", layout(1, 1, 2, 1, "1f1b"), 2);
  pp_parity("pp2_1f1b_m4", layout(1, 1, 2, 4, "1f1b"), 2, /*with_control=*/true);
  pp_parity("pp2_gpipe_m4", layout(1, 1, 2, 4, "gpipe"), 2);
  pp_parity("pp4_1f1b_m8", layout(1, 1, 4, 8, "1f1b"), 4);
}

TEST_CASE("pp parity: interleaved 1f1b at pp 2 with 2 virtual stages (m 4); virtual stages that do not divide layers exit 2") {
  pp_parity("pp2_interleaved_v2_m4",
            with(layout(1, 1, 2, 4, "interleaved_1f1b"), {"parallel.pipeline.virtual_stages=2"}), 2);
  auto [code, output] = launch_raw("pp2_v3", with(kCommon, with(layout(1, 1, 2, 4, "interleaved_1f1b"),
                                                                {"parallel.pipeline.virtual_stages=3"})));
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("parallel.pipeline.virtual_stages = 3 with parallel.pp = 2 does not divide model.layers = 4") !=
        std::string::npos);
}

TEST_CASE("uneven stages: layers_per_stage [1, 3] at pp 2 and [2, 1, 1] at pp 3 (4 layers) match one process; bad lists exit 2") {
  pp_parity("pp2_stages_1_3", with(layout(1, 1, 2, 4, "1f1b"), {"parallel.pipeline.layers_per_stage=[1, 3]"}), 2);
  pp_parity("pp3_stages_2_1_1", with(layout(1, 1, 3, 4, "1f1b"), {"parallel.pipeline.layers_per_stage=[2, 1, 1]"}), 3);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 1]", "parallel.pipeline.layers_per_stage = [1, 1] sums to 2 but model.layers = 4"},
      {"[4]", "parallel.pipeline.layers_per_stage = [4] lists 1 stage(s) but parallel.pp = 2"},
      {"[0, 4]", "gives a stage 0 blocks; every stage needs at least 1"}};
  for (const auto& [list, message] : bad) {
    auto [code, output] =
        launch_raw("pp2_bad_stages", with(kCommon, with(layout(1, 1, 2, 4, "1f1b"),
                                                        {"parallel.pipeline.layers_per_stage=" + list})));
    INFO(output);
    CHECK(code == 2);
    CHECK(output.find(message) != std::string::npos);
  }
  // Without the list, pp 3 cannot split 4 layers, and the error names the way out.
  auto [code, output] = launch_raw("pp3_even", with(kCommon, layout(1, 1, 3, 4, "1f1b")));
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("or give parallel.pipeline.layers_per_stage") != std::string::npos);
}

TEST_CASE("zb_h1 (split backward) matches one process: pp 2 m 4, pp 4 m 8, dp2 x tp2 x pp2 with SP and with ZeRO-1") {
  pp_parity("pp2_zb_h1_m4", layout(1, 1, 2, 4, "zb_h1"), 2);
  pp_parity("pp4_zb_h1_m8", layout(1, 1, 4, 8, "zb_h1"), 4);
  pp_parity("dp2_tp2_pp2_zb_h1_sp", with(layout(2, 2, 2, 2, "zb_h1"), {"parallel.sequence_parallel=true"}), 2);
  pp_parity("dp2_tp2_pp2_zb_h1_zero1", with(layout(2, 2, 2, 2, "zb_h1"), {"parallel.zero=1"}), 2);
  // Every stage splits: each logs its measured bubble next to the simulated one.
  const std::string log = read_file(Parity::get().dir / "pp4_zb_h1_m8/rank_3.log");
  CHECK(log.find("pipeline rank 3: measured bubble") != std::string::npos);
}

TEST_CASE("3D with ZeRO-1 over dp: dp 2 x tp 2 x pp 2 matches one process") {
  pp_parity("dp2_tp2_pp2_zero1", with(layout(2, 2, 2, 2, "1f1b"), {"parallel.zero=1"}), 2);
}

TEST_CASE("3D: dp 2 x tp 2 x pp 2 on 8 ranks matches one process; its checkpoint resumes on 1x1x1, 4x1x2 and 2x2x2 ZeRO-1") {
  const RunResult& straight =
      cached("dp2_tp2_pp2", with(layout(2, 2, 2, 2, "1f1b"), {"checkpoint.every=10", "checkpoint.keep=5"}));
  compare("dp2_tp2_pp2 vs 1 process", straight, nullptr, reference());
  check_coordinates_match_topo("dp2_tp2_pp2", layout(2, 2, 2, 2, "1f1b"), 8);
  auto& p = Parity::get();
  const auto want = losses_by_step(p.dir / "dp2_tp2_pp2/metrics.jsonl");
  REQUIRE(want.size() == size_t(kSteps));
  const std::vector<std::pair<std::string, std::vector<std::string>>> targets = {
      {"3d_to_1x1x1", {"train.micro_batch=8"}},
      {"3d_to_4x1x2", layout(4, 1, 2, 2, "1f1b")},
      {"3d_to_2x2x2_zero1", with(layout(2, 2, 2, 2, "gpipe"), {"parallel.zero=1"})}};
  for (const auto& [name, sets] : targets) {
    auto [code, output] = launch_raw(name, with(kCommon, with(sets, {"checkpoint.every=0"})),
                                     {"--resume-from", p.dir / "dp2_tp2_pp2/ckpt/step_10"});
    INFO(output);
    REQUIRE(code == 0);
    const ResumeDiffs d = resume_diffs(name, 10, want, straight.params);
    MESSAGE("2x2x2 step_10 -> " << name.substr(6) << ": max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                << kLossRelTol << "), max param abs diff " << d.param_abs << " (tol " << kParamAbsTol
                                << ")");
    CHECK(d.loss_rel <= kLossRelTol);
    CHECK(d.param_abs <= kParamAbsTol);
  }
  // The negative control: the resume on 1x1x1 with AdamW's moments zeroed on load.
  auto [code, output] = launch_raw("3d_to_1x1x1_reset", with(kCommon, {"train.micro_batch=8", "checkpoint.every=0",
                                                                       "fault.kind=reset_moments_on_load"}),
                                   {"--resume-from", p.dir / "dp2_tp2_pp2/ckpt/step_10"});
  INFO(output);
  REQUIRE(code == 0);
  check_resume_control("2x2x2 step_10 -> 1x1x1", resume_diffs("3d_to_1x1x1_reset", 10, want, straight.params));
}
