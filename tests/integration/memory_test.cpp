// Activation checkpointing and tiled attention in real training runs (the
// harness of tests/support/parity.h, dropout 0.1 everywhere):
// train.recompute full and selective against none on one process (every
// step's loss and grad norm within 1e-6 relative, the final parameters
// within 1e-6), with a negative control whose recomputation draws other
// masks; their measured step peak (metrics.jsonl peak_bytes) lower than
// none's; recompute composed with ZeRO-3 over dp 2 and with a 1F1B pipeline
// against the 1-process run (1e-5); model.attention tiled against naive.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

constexpr double kRecomputeTol = 1e-6;

const std::vector<std::string> kDropout = {"model.dropout=0.1", "train.adam_eps=1e-6"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kDropout, sets));
}

double peak(const std::string& name) {
  const auto peaks = read_metric(Parity::get().dir / name + "/metrics.jsonl", "peak_bytes");
  REQUIRE(!peaks.empty());
  return peaks.back();
}

// `run` within `tol` of `ref` (losses and grad norms relative, parameters absolute).
void check_close(const std::string& what, const RunResult& run, const RunResult& ref, double tol) {
  const Diffs d = differences(run, ref);
  MESSAGE(what << ": max loss rel diff " << d.loss_rel << ", grad-norm rel diff " << d.norm_rel
               << ", param abs diff " << d.param_abs << " (tol " << tol << ")");
  CHECK(ref.losses.back() < ref.losses.front() - 0.1);
  CHECK(d.loss_rel <= tol);
  CHECK(d.norm_rel <= tol);
  CHECK(d.param_abs <= tol);
}

}  // namespace

TEST_CASE("recompute full and selective match none with dropout 0.1, with a lower step peak") {
  const RunResult& none = cached("rc_none", {"train.recompute=none"});
  for (const std::string mode : {"full", "selective"}) {
    const RunResult& run = cached("rc_" + mode, {"train.recompute=" + mode});
    check_close("recompute " + mode + " vs none", run, none, kRecomputeTol);
    const RunResult& control =
        cached("rc_" + mode + "_redraw", {"train.recompute=" + mode, "fault.kind=recompute_redraw"});
    const Diffs c = differences(control, none);
    MESSAGE("  negative control (recomputation draws the next step's masks): loss rel diff " << c.loss_rel
            << ", grad-norm rel diff " << c.norm_rel << ", param abs diff " << c.param_abs
            << " (grad norm and params must be >= " << kControlFactor << " x " << kRecomputeTol << ")");
    CHECK(c.loss_rel > kRecomputeTol);
    CHECK(c.norm_rel >= kControlFactor * kRecomputeTol);
    CHECK(c.param_abs >= kControlFactor * kRecomputeTol);
    MESSAGE("  step peak: none " << peak("rc_none") << " B, " << mode << " " << peak("rc_" + mode) << " B");
    CHECK(peak("rc_" + mode) < peak("rc_none"));
  }
  CHECK(peak("rc_full") < peak("rc_selective"));
}

TEST_CASE("recompute full composes with ZeRO-3 over dp 2 and with a 1F1B pipeline of 2 stages") {
  const RunResult& none = cached("rc_none", {"train.recompute=none"});
  check_close("dp 2 x ZeRO-3, recompute full vs 1 process", 
              cached("rc_full_zero3", with(ranks(2, 4), {"train.recompute=full", "parallel.zero=3"})), none, 1e-5);
  check_close("pp 2 (1f1b, 4 micro-batches) x DDP, recompute full vs 1 process",
              cached("rc_full_pp2", {"cluster.procs_per_node=2", "parallel.pp=2", "train.micro_batch=2",
                                     "train.grad_accum=4", "train.recompute=full"}),
              none, 1e-5);
}

TEST_CASE("model.attention tiled trains like naive (dropout 0.1), also under tp 2 and with selective recompute") {
  const RunResult& naive = cached("rc_none", {"train.recompute=none"});
  check_close("attention tiled vs naive", cached("att_tiled", {"model.attention=tiled"}), naive, 1e-5);
  check_close("attention tiled, tp 2 vs naive 1 process",
              cached("att_tiled_tp2", {"model.attention=tiled", "cluster.procs_per_node=2", "parallel.tp=2"}), naive,
              1e-5);
  // Control: a run whose attention-probability masks differ (selective
  // recompute redrawing them) must miss the naive run by far.
  const Diffs c =
      differences(cached("rc_selective_redraw", {"train.recompute=selective", "fault.kind=recompute_redraw"}), naive);
  MESSAGE("  negative control (other attention masks): grad-norm rel diff " << c.norm_rel << ", param abs diff "
          << c.param_abs << " (each must be >= " << kControlFactor << " x 1e-5)");
  CHECK(c.norm_rel >= kControlFactor * 1e-5);
  CHECK(c.param_abs >= kControlFactor * 1e-5);
  MESSAGE("  step peak: naive " << peak("rc_none") << " B, tiled " << peak("att_tiled") << " B");
  CHECK(peak("att_tiled") < peak("rc_none"));
}

// parallel.reduce_dtype bf16 rounds each DDP bucket to bf16 before the
// all-reduce; Gloo carries (and adds) bf16 as fp32 (engine/comm/gloo_group.cpp),
// so on the CPU the bytes stay those of fp32 and only the rounding shows.
TEST_CASE("bf16: autocast trains within 3% of fp32; gradients reduced in fp32 unless reduce_dtype bf16 asks") {
  const RunResult& fp32 = cached("dp2_fp32", ranks(2, 4));
  const RunResult& bf16 = cached("dp2_bf16", with(ranks(2, 4), {"train.precision=bf16"}));
  const RunResult& bf16_wire = cached("dp2_bf16_wire", with(ranks(2, 4), {"train.precision=bf16", "parallel.reduce_dtype=bf16"}));
  const auto bytes = [](const std::string& name) {
    return read_metric(Parity::get().dir / name + "/metrics.jsonl", "dp_bytes_sent").back();
  };
  const double rel = std::fabs(bf16.losses.back() / fp32.losses.back() - 1);
  const double rel_wire = std::fabs(bf16_wire.losses.back() / fp32.losses.back() - 1);
  MESSAGE("final loss after " << kSteps << " steps: fp32 " << fp32.losses.back() << ", bf16 " << bf16.losses.back()
                              << " (" << 100 * rel << "%), bf16 + bf16 reduce " << bf16_wire.losses.back() << " ("
                              << 100 * rel_wire << "%; tol 3%); dp bytes per step: fp32 " << bytes("dp2_fp32")
                              << ", bf16 with fp32 reduce " << bytes("dp2_bf16") << ", bf16 reduce "
                              << bytes("dp2_bf16_wire"));
  CHECK(fp32.losses.back() < fp32.losses.front() - 0.1);
  CHECK(rel <= 0.03);
  CHECK(rel_wire <= 0.03);
  CHECK(bf16.losses != fp32.losses);  // autocast did change the arithmetic
  CHECK(bytes("dp2_bf16") == bytes("dp2_fp32"));       // fp32 gradients all-reduced
  CHECK(bytes("dp2_bf16_wire") == bytes("dp2_fp32"));  // Gloo: bf16 travels as fp32
  const Diffs rounding = differences(bf16_wire, bf16);
  MESSAGE("bf16 reduce vs fp32 reduce (both under bf16 autocast): max grad-norm rel diff " << rounding.norm_rel
          << ", param abs diff " << rounding.param_abs << " (the bf16 rounding of the gradients; must be > 0)");
  CHECK(rounding.norm_rel > 0);
}
