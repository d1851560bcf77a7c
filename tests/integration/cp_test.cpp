// Context parallelism: parity with the 1-process run (the harness of
// tests/support/parity.h: every step's loss and grad norm within 1e-5
// relative, the merged final parameters within 1e-5) for cp 2, cp 4,
// dp 2 x cp 2 x tp 2, cp 2 x pp 2 and cp 2 with ZeRO-3, all with dropout 0.1
// (layout-invariant masks at global positions); a cp 2 checkpoint resumed
// at cp 1 and at cp 4; bad cp and order values refused before any worker.
// Negative control: cp 2 with fault.kind cp_local_attention (each rank
// attends to its own chunks only). Each cp run also shows from the engine's
// comm.tsv that its cp group carried exactly the ring's bytes
// (ring_attention.h's formula, which `dtrain topo` predicts).
//
// Every run here uses lr 1e-2 (the harness's 3e-3 leaves the tiny model a
// unigram model after 20 steps, where attention to far tokens barely moves
// the loss and the control would miss by less than 100x) and AdamW eps 1e-3:
// at lr 1e-2 with eps 1e-6 a gradient element of pure rounding noise becomes
// an update of lr * g / eps (tp_test.cpp), and one process run with the
// naive attention instead of the tiled one already misses its own grad norm
// by 6e-5 at step 17; with eps 1e-3 that is 1e-7 and cp 2 and cp 4 2e-7.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

const std::vector<std::string> kCommon = {"train.adam_eps=1e-3", "train.lr=1e-2", "model.attention=tiled",
                                          "model.dropout=0.1"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kCommon, sets));
}

const RunResult& reference() { return cached("cp_ref", {"train.micro_batch=8"}); }

std::vector<std::string> layout(int dp, int cp, int tp = 1, int pp = 1) {
  return {"cluster.procs_per_node=" + std::to_string(dp * cp * tp * pp), "parallel.dp=" + std::to_string(dp),
          "parallel.cp=" + std::to_string(cp),      "parallel.tp=" + std::to_string(tp),
          "parallel.pp=" + std::to_string(pp),      "train.micro_batch=" + std::to_string(8 / dp)};
}

// The last step's cp bytes of every rank (comm.tsv's cp_bytes column) equal
// the ring's: per block of the rank's stage, with kv = micro_batch x T/cp x
// d_model/tp fp32 elements of K or of V, 4 (cp-1) kv forward and backward
// plus 2 cp kv of fp32 gradients (base_spec: 2 layers, d_model 32, T 32).
void check_ring_bytes(const std::string& name, int dp, int cp, int tp, int pp) {
  auto& p = Parity::get();
  std::ifstream in(p.dir / name + "/comm.tsv");
  std::string header, line;
  std::getline(in, header);
  REQUIRE(header == "rank\tdp_bytes\ttp_bytes\tep_bytes\tcp_bytes");
  const long long kv = 4LL * (8 / dp) * (32 / cp) * (32 / tp), blocks = 2 / pp;
  const long long want = blocks * (4LL * (cp - 1) * kv + 2LL * cp * kv);
  int rows = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    long long rank = 0, dpb = 0, tpb = 0, epb = 0, cpb = 0;
    f >> rank >> dpb >> tpb >> epb >> cpb;
    CHECK_MESSAGE(cpb == want, name << " rank " << rank << " sent " << cpb << " cp bytes, the ring's formula " << want);
    ++rows;
  }
  CHECK(rows == dp * cp * tp * pp);
  // `dtrain topo` predicts the same bytes for every cp group.
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "topo", p.dir / "spec.yaml", "--format", "json"};
  for (const auto& set : with(kCommon, layout(dp, cp, tp, pp))) argv.insert(argv.end(), {"--set", set});
  auto [code, out] = dtrain::testing::run_command(argv, p.dir / (name + ".topo.json"));
  REQUIRE(code == 0);
  int groups = 0;
  const nlohmann::json topo = nlohmann::json::parse(out);
  for (const auto& g : topo["groups"])
    if (g["axis"] == "cp") {
      CHECK(g["bytes_per_step"].get<long long>() == want);
      ++groups;
    }
  CHECK(groups == dp * tp * pp);
  MESSAGE(name << ": every rank's cp group carried " << want << " bytes in the last step, as `dtrain topo` predicts for "
               << groups << " cp groups (the ring's formula)");
}

}  // namespace

TEST_CASE("cp parity: cp 2 (with a negative control) and cp 4 on one process's batch, dropout 0.1") {
  const RunResult& ref = reference();
  compare("cp2 vs 1 process", cached("cp2", layout(1, 2)),
          &cached("cp2_local", with(layout(1, 2), {"fault.kind=cp_local_attention"})), ref,
          "cp_local_attention: each rank attends to its own chunks only");
  check_ring_bytes("cp2", 1, 2, 1, 1);
  compare("cp4 vs 1 process", cached("cp4", layout(1, 4)), nullptr, ref);
  check_ring_bytes("cp4", 1, 4, 1, 1);
}

TEST_CASE("cp parity: dp 2 x cp 2 x tp 2, cp 2 x pp 2 and dp 2 x cp 2 with ZeRO-3") {
  const RunResult& ref = reference();
  compare("dp2_cp2_tp2 vs 1 process", cached("dp2_cp2_tp2", layout(2, 2, 2)), nullptr, ref);
  check_ring_bytes("dp2_cp2_tp2", 2, 2, 2, 1);
  compare("cp2_pp2 vs 1 process", cached("cp2_pp2", layout(1, 2, 1, 2)), nullptr, ref);
  check_ring_bytes("cp2_pp2", 1, 2, 1, 2);
  compare("dp2_cp2_zero3 vs 1 process", cached("dp2_cp2_zero3", with(layout(2, 2), {"parallel.zero=3"})), nullptr,
          ref);
}

TEST_CASE("dtrain plan: a rank's activation bytes fall as 1/cp at seq_len 512") {
  auto& p = Parity::get();
  std::vector<long long> act;
  for (int cp : {1, 2, 4}) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "plan", p.dir / "spec.yaml", "--format", "json",
                                     "--no-probe"};
    for (const auto& set : with(kCommon, with(layout(1, cp), {"model.seq_len=512"}))) argv.insert(argv.end(), {"--set", set});
    auto [code, out] = dtrain::testing::run_command(argv, p.dir / ("plan_cp" + std::to_string(cp) + ".json"));
    REQUIRE(code == 0);
    act.push_back(nlohmann::json::parse(out)["ranks"][0]["activation_bytes"].get<long long>());
  }
  MESSAGE("plan's rank 0 activation bytes at cp 1, 2, 4: " << act[0] << ", " << act[1] << ", " << act[2]);
  CHECK(act[1] * 2 == act[0]);
  CHECK(act[2] * 4 == act[0]);
}

TEST_CASE("a cp 2 checkpoint resumes at cp 1 and at cp 4 within 1e-5 of the straight run") {
  auto& p = Parity::get();
  auto [code, output] =
      launch_raw("cp2_straight", with(kCommon, with(layout(1, 2), {"checkpoint.every=10", "checkpoint.keep=5"})));
  INFO(output);
  REQUIRE(code == 0);
  const auto want = losses_by_step(p.dir / "cp2_straight/metrics.jsonl");
  REQUIRE(want.size() == size_t(kSteps));
  const auto want_params = dtrain::testing::read_checkpoint_params(p.dir / "cp2_straight/ckpt", p.dir.path());
  for (int cp : {1, 4}) {
    const std::string name = "cp2_to_cp" + std::to_string(cp);
    auto [code2, output2] = launch_raw(name, with(kCommon, with(layout(1, cp), {"checkpoint.every=0"})),
                                       {"--resume-from", p.dir / "cp2_straight/ckpt/step_10"});
    INFO(output2);
    REQUIRE(code2 == 0);
    const ResumeDiffs d = resume_diffs(name, 10, want, want_params);
    MESSAGE("cp 2 step_10 -> cp " << cp << ": max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                  << kLossRelTol << "), max param abs diff " << d.param_abs << " (tol "
                                  << kParamAbsTol << ")");
    CHECK(d.loss_rel <= kLossRelTol);
    CHECK(d.param_abs <= kParamAbsTol);
  }
}

TEST_CASE("bad cp and order: exit 2 before any worker, naming the field and the fix") {
  struct Bad {
    std::vector<std::string> sets;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {{"parallel.cp=3", "cluster.procs_per_node=3"}, "parallel.cp = 3 needs model.seq_len = 32 divisible by 2 x cp = 6"},
      {{"parallel.cp=2", "cluster.procs_per_node=2", "model.moe.experts=2"},
       "parallel.cp = 2 with model.moe.experts = 2: mixture of experts does not run under context parallelism yet"},
      {{"parallel.cp=2", "parallel.tp=2", "cluster.procs_per_node=4", "parallel.sequence_parallel=true"},
       "parallel.cp = 2 with parallel.sequence_parallel = true"},
      {{"parallel.cp=2", "cluster.procs_per_node=2", "model.attention=naive"},
       "model.attention = naive with parallel.cp = 2: context parallelism runs ring attention over the tiled kernel; "
       "set model.attention: tiled"},
      {{"parallel.cp=2", "cluster.procs_per_node=4"},
       "parallel: dp(1) * tp(1) * pp(1) * cp(2) = 2 != cluster.nodes(1) * cluster.procs_per_node(4) = 4; use dp 2"},
      {{"parallel.order=tp-cp-xp-pp"}, "parallel.order = tp-cp-xp-pp: 'xp' is not an axis"},
      {{"parallel.order=tp-cp-dp"}, "parallel.order = tp-cp-dp: axis pp is missing"},
  };
  for (const Bad& b : cases) {
    auto [code, output] = launch_raw("bad_cp", with(kCommon, b.sets));
    INFO(output);
    CHECK(code == 2);
    CHECK_MESSAGE(output.find(b.says) != std::string::npos, "missing: " << b.says);
    CHECK(output.find("[rank 0]") == std::string::npos);  // no worker started
  }
}
