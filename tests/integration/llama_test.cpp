// model.kind llama in every layout: parity with the 1-process run (the
// harness of tests/support/parity.h: every step's loss and grad norm within
// 1e-5 relative, the merged final parameters, under LLAMA_NAMES's global
// names and shapes, within 1e-5) of a tiny Llama (d_model 32, 4 heads, 2 kv
// heads, SwiGLU hidden 64, 2 layers, seq 32) for
//   dp 2 x tp 2 with sequence parallelism (kv heads split over tp),
//   tp 4 (kv heads replicated: tp % kv_heads == 0) with full recomputation,
//   pp 2 x tp 2 with the zero-bubble zb_h1 schedule,
//   ZeRO-3 over dp 4,
//   cp 2 with the tiled core (ring attention over grouped-query heads,
//   rotary at global positions) and selective recomputation, against the
//   1-process run with the tiled core,
//   a Mixtral-style MoE llama at ep 2 x dp 4 (against its own reference);
// a dp 2 x tp 2 checkpoint resumed at tp 4; a tied head at pp 2 (control:
// fault.kind no_grad_sync at dp 1, the stages' wte gradients not swapped)
// and at ZeRO-3 over dp 2.
// Negative control: dp 2 x tp 2 with fault.kind no_tp_reduce.
// Like tp_test.cpp, every run uses AdamW eps 1e-6 (a TP layout adds partial
// products in another order; eps 1e-8 would let rounding-noise gradient
// elements decide the parameter comparison).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

const std::vector<std::string> kLlama = {"train.adam_eps=1e-6", "model.kind=llama", "model.heads=4",
                                         "model.kv_heads=2", "model.ffn_hidden=64"};

const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, with(kLlama, sets));
}

const RunResult& reference(const std::string& attention = "naive") {
  return cached("llama_ref_" + attention, {"train.micro_batch=8", "model.attention=" + attention});
}

// dp x tp x pp x cp ranks, m micro-batches per step, global batch 8.
std::vector<std::string> layout(int dp, int tp, int pp = 1, int cp = 1, int m = 1) {
  return {"cluster.procs_per_node=" + std::to_string(dp * tp * pp * cp), "parallel.dp=" + std::to_string(dp),
          "parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
          "parallel.cp=" + std::to_string(cp), "train.micro_batch=" + std::to_string(8 / (dp * m)),
          "train.grad_accum=" + std::to_string(m)};
}

void parity(const std::string& name, const std::vector<std::string>& sets, const RunResult& ref,
            const std::string& control_fault = "") {
  const RunResult& run = cached(name, sets);
  CHECK(run.output.find("model llama") != std::string::npos);
  if (control_fault.empty()) return compare(name + " vs 1 process", run, nullptr, ref);
  const RunResult& control = cached(name + "_" + control_fault, with(sets, {"fault.kind=" + control_fault}));
  CHECK(control.output.find("fault.kind = " + control_fault) != std::string::npos);
  compare(name + " vs 1 process", run, &control, ref, "fault.kind " + control_fault);
}

}  // namespace

TEST_CASE("llama parity: dp 2 x tp 2 sequence-parallel (kv split, with a no_tp_reduce control), tp 4 (kv replicated) with full recomputation") {
  parity("llama_dp2_tp2_sp", with(layout(2, 2), {"parallel.sequence_parallel=true"}), reference(), "no_tp_reduce");
  parity("llama_tp4_recompute", with(layout(1, 4), {"train.recompute=full"}), reference());
}

TEST_CASE("llama parity: pp 2 x tp 2 with zb_h1, ZeRO-3 over dp 4") {
  parity("llama_pp2_tp2_zbh1", with(layout(1, 2, 2, 1, 2), {"parallel.pipeline.schedule=zb_h1"}), reference());
  parity("llama_zero3_dp4", with(layout(4, 1), {"parallel.zero=3"}), reference());
}

TEST_CASE("llama parity: cp 2 (ring attention, rotary at global positions) with selective recomputation, tiled core") {
  parity("llama_cp2_tiled", with(layout(1, 1, 1, 2), {"model.attention=tiled", "train.recompute=selective"}),
         reference("tiled"));
}

TEST_CASE("a llama dp 2 x tp 2 checkpoint (kv split) resumes at tp 4 (kv replicated) within 1e-5 of the straight run") {
  auto& p = Parity::get();
  auto [code, output] =
      launch_raw("llama_straight", with(kLlama, with(layout(2, 2), {"checkpoint.every=10", "checkpoint.keep=5"})));
  INFO(output);
  REQUIRE(code == 0);
  const auto want = losses_by_step(p.dir / "llama_straight/metrics.jsonl");
  REQUIRE(want.size() == size_t(kSteps));
  const auto want_params = dtrain::testing::read_checkpoint_params(p.dir / "llama_straight/ckpt", p.dir.path());
  auto [code2, output2] = launch_raw("llama_to_tp4", with(kLlama, with(layout(1, 4), {"checkpoint.every=0"})),
                                     {"--resume-from", p.dir / "llama_straight/ckpt/step_10"});
  INFO(output2);
  REQUIRE(code2 == 0);
  const ResumeDiffs d = resume_diffs("llama_to_tp4", 10, want, want_params);
  MESSAGE("llama dp 2 x tp 2 step_10 -> tp 4: max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                                                  << kLossRelTol << "), max param abs diff "
                                                                  << d.param_abs << " (tol " << kParamAbsTol << ")");
  CHECK(d.loss_rel <= kLossRelTol);
  CHECK(d.param_abs <= kParamAbsTol);
}

TEST_CASE("a tied llama head: pp 2 (wte copies on the first and last stage, no-swap control) and ZeRO-3 over dp 2") {
  const RunResult& ref = cached("llama_tied_ref", {"train.micro_batch=8", "model.tie_embeddings=true"});
  CHECK(ref.params.count("head.weight") == 0);
  const std::vector<std::string> pp2 = with(layout(1, 1, 2, 1, 2), {"model.tie_embeddings=true"});
  const RunResult& run = cached("llama_tied_pp2", pp2);
  CHECK(run.output.find("tied wte.weight: gradient summed with pp stage") != std::string::npos);
  // dp 1: no_grad_sync's only reduction to skip is the stages' wte gradient swap
  const RunResult& control = cached("llama_tied_pp2_no_sync", with(pp2, {"fault.kind=no_grad_sync"}));
  CHECK(control.output.find("tied wte copies of the first and last stages keep their own gradients") != std::string::npos);
  compare("llama_tied_pp2 vs 1 process", run, &control, ref, "fault.kind no_grad_sync: no wte gradient swap");
  const RunResult& zero3 = cached("llama_tied_zero3_dp2", with(layout(2, 1), {"model.tie_embeddings=true", "parallel.zero=3"}));
  compare("llama_tied_zero3_dp2 vs 1 process", zero3, nullptr, ref);
}

TEST_CASE("llama MoE parity (Mixtral: SwiGLU experts, gates renormalised): ep 2 at dp 4") {
  // As moe_test.cpp: the reference runs the dp ranks' micro-batches one after
  // the other (routing and capacity are per micro-batch); capacity_factor 4
  // drops nothing.
  const std::vector<std::string> moe = {"model.moe.experts=4", "model.moe.top_k=2", "model.moe.d_ff=32",
                                        "model.moe.capacity_factor=4"};
  const RunResult& ref = cached("llama_moe_ref", with(moe, {"train.micro_batch=2", "train.grad_accum=4"}));
  const RunResult& run = cached("llama_moe_ep2_dp4", with(moe, {"cluster.procs_per_node=4", "parallel.dp=4",
                                                                "parallel.ep=2", "train.micro_batch=2"}));
  CHECK(run.output.find("over ep 2") != std::string::npos);
  CHECK(run.output.find("model llama") != std::string::npos);
  CHECK(run.params.count("blocks.0.moe.fc.weight") == 1);
  CHECK(run.params.count("blocks.0.moe.fc.bias") == 0);
  compare("llama_moe_ep2_dp4 vs 1 process", run, nullptr, ref);
}
