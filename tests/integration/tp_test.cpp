// Tensor parallelism: parity with the 1-process run (the
// harness of tests/support/parity.h: every step's loss and grad norm within
// 1e-5 relative, the merged final parameters within 1e-5) for tp 2, tp 4,
// dp 2 x tp 2, tp 2 with ZeRO-1 and ZeRO-3 over dp, and sequence
// parallelism; with dropout 0.1, every layout against the 1-process run
// with dropout 0.1 (layout-invariant masks); a tp 2 checkpoint resumed at
// tp 1 and at tp 4; bad tp values refused before any worker. Negative
// controls: tp 2 with fault.kind no_tp_reduce, dp 2 x tp 2 ZeRO-3 with
// no_grad_sync, the resume at tp 1 with reset_moments_on_load. Every parity run also shows from the engine's
// memory.tsv and comm.tsv that it was tensor-parallel: each rank holds
// about 1/tp of the parameter bytes and sent bytes through its tp group.
//
// Every run here, the references included, uses AdamW eps 1e-6 instead of
// 1e-8: a TP layout adds partial products in another order, and a gradient
// element that is pure rounding noise (|g| ~ 1e-9, below eps) is turned by
// Adam into an update of lr * g / eps, so its relative noise (~10%) shows
// in the parameters (4.6e-5 after 20 steps with eps 1e-8, one element of
// wte's row of a rare byte). eps 1e-6 keeps such elements from deciding the
// comparison; losses and every other element match to ~1e-7 either way.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
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

// The rows of a tab-separated table the engine writes (memory.tsv,
// comm.tsv), header skipped.
std::vector<std::vector<double>> read_tsv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::vector<double>> rows;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<double> row;
    for (double v; fields >> v;) row.push_back(v);
    rows.push_back(row);
  }
  return rows;
}

bool has(const std::vector<std::string>& sets, const std::string& set) {
  return std::find(sets.begin(), sets.end(), set) != sets.end();
}

// The run was tensor-parallel, from what the engine wrote at its end: every
// rank sent at least one fp32 activation [B, T, C] per block through its tp
// group in the last step (comm.tsv; the row-parallel reductions alone move
// 2 per block forward, while a tp group that only sums the gradient norm
// sends 8 bytes), and holds about 1/tp of the 1-process run's parameter
// bytes P (memory.tsv).
// The bound: TP keeps R bytes whole on every rank (tensor_parallel.h: wpe
// [T, C], each LayerNorm's weight and bias, the 2 row-parallel biases of
// each block; with tp_vocab replicated also wte and head [V, C]), so a rank
// holds (P - R) / tp + R, in [P / tp, P / tp + R (1 - 1/tp)]. ZeRO-3 shards
// that over dp too (divided by dp, plus at most dp - 1 elements of padding
// per unit: layers + 2 units).
void check_tp_layout(const std::string& name, int dp, int tp, int heads, const std::vector<std::string>& more) {
  auto& p = Parity::get();
  const auto ref = read_tsv(p.dir / ("ref_heads" + std::to_string(heads)) + "/memory.tsv");
  const auto memory = read_tsv(p.dir / name + "/memory.tsv");
  const auto comm = read_tsv(p.dir / name + "/comm.tsv");
  REQUIRE(ref.size() == 1);
  REQUIRE(memory.size() == size_t(dp * tp));
  REQUIRE(comm.size() == size_t(dp * tp));
  const int layers = 2, d = 32, T = 32, V = 256;  // base_spec's model
  const double R = 4.0 * d * (T + 2 * (2 * layers + 1) + 2 * layers) +
                   (has(more, "model.tp_vocab=replicated") ? 4.0 * 2 * V * d : 0);
  const bool zero3 = has(more, "parallel.zero=3");
  const double shards = zero3 ? dp : 1, padding = zero3 ? 4.0 * (dp - 1) * (layers + 2) : 0;
  const double P = ref[0][1], lo = P / tp / shards, hi = (P / tp + R * (1 - 1.0 / tp)) / shards + padding;
  const double min_tp_bytes = 4.0 * (8 / dp) * T * d * layers;  // B = micro_batch = 8 / dp
  double least_tp = 1e300, min_params = 1e300, max_params = 0;
  for (size_t r = 0; r < memory.size(); ++r) {
    least_tp = std::min(least_tp, comm[r][2]);
    min_params = std::min(min_params, memory[r][1]);
    max_params = std::max(max_params, memory[r][1]);
  }
  MESSAGE(name << ": rank parameter bytes " << min_params << " to " << max_params << " of the 1-process run's "
               << P << " (tp " << tp << std::string(zero3 ? ", ZeRO-3 over dp " + std::to_string(dp) : "")
               << ": must lie in [" << lo << ", " << hi << "]); least tp bytes sent by a rank in the last step: "
               << least_tp << " (must be >= " << min_tp_bytes << ")");
  CHECK(least_tp >= min_tp_bytes);
  CHECK(min_params >= lo);
  CHECK(max_params <= hi);
}

// control_fault: "" (none) or the fault.kind of this layout's negative control.
void tp_parity(const std::string& name, int dp, int tp, int heads, const std::vector<std::string>& more = {},
               const std::string& control_fault = "") {
  const RunResult& ref = reference(heads);
  const RunResult& run = cached(name, with(layout(dp, tp, heads), more));
  CHECK(run.output.find("tp(" + std::to_string(tp) + ")") != std::string::npos);
  check_tp_layout(name, dp, tp, heads, more);
  const std::string what = name + " vs 1 process (heads " + std::to_string(heads) + ")";
  if (control_fault.empty()) return compare(what, run, nullptr, ref);
  const RunResult& control =
      cached(name + "_" + control_fault, with(layout(dp, tp, heads), with(more, {"fault.kind=" + control_fault})));
  CHECK(control.output.find("fault.kind = " + control_fault) != std::string::npos);
  compare(what, run, &control, ref, "fault.kind " + control_fault);
}

}  // namespace

TEST_CASE("tp parity: tp 2 (with a negative control) and tp 4 on one process's batch") {
  tp_parity("tp2", 1, 2, 2, {}, "no_tp_reduce");
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

TEST_CASE("tp parity: dp 2 x tp 2 with DDP, ZeRO-1 and ZeRO-3 (with a no_grad_sync control)") {
  tp_parity("dp2_tp2", 2, 2, 2);
  tp_parity("dp2_tp2_zero1", 2, 2, 2, {"parallel.zero=1"});
  tp_parity("dp2_tp2_zero3", 2, 2, 2, {"parallel.zero=3"}, "no_grad_sync");
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
  // The negative control: the resume at tp 1 with AdamW's moments zeroed on load.
  auto [code3, output3] =
      launch_raw("tp2_to_tp1_reset", with(kCommon, with(layout(1, 1, 4), {"checkpoint.every=0", "fault.kind=reset_moments_on_load"})),
                 {"--resume-from", p.dir / "tp2_straight/ckpt/step_10"});
  INFO(output3);
  REQUIRE(code3 == 0);
  CHECK(output3.find("fault.kind = reset_moments_on_load: AdamW's moments") != std::string::npos);
  check_resume_control("tp 2 step_10 -> tp 1", resume_diffs("tp2_to_tp1_reset", 10, want, want_params));
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
