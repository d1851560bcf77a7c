// ZeRO-1/2/3: parity with the 1-process run (the parity harness
// of tests/support/parity.h: losses and grad norms within 1e-5 relative,
// final parameters within 1e-5, max differences printed, a negative control
// (fault.kind no_grad_sync) per stage) at dp = 4 and at dp = 3 (units that
// do not divide evenly, so shards are padded), each also with grad_accum 2,
// and ZeRO-3 gathering (parallel.fsdp.shared_params false: the path across
// machines; also with reshard_after_forward and prefetch off), whose losses
// and grad norms equal the shared parameters' exactly; ZeRO-2 at dp 2 over Gloo's TCP
// (cluster.shm false) while the others use shared memory (metrics.jsonl's
// comm_path); a ZeRO-3 run SIGKILLed and restarted continues
// bit-exactly; a ZeRO-3 dp=4 checkpoint resumes as DDP at dp = 2 (negative
// control: reset_moments_on_load); rank 0's persistent bytes match the
// fp32-Adam formulas, and its step peak `dtrain plan`'s (shared-memory
// buffers counted); bad input is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

std::string stage_set(int zero) { return "parallel.zero=" + std::to_string(zero); }

// Runs shared by several cases (the parity runs feed the memory check).
const RunResult& cached(const std::string& name, const std::vector<std::string>& sets) {
  return Parity::get().cached(name, sets);
}

// The elements of padding the start-up line reports ("(N + K padding elements)").
long padding_of(const RunResult& r) {
  const auto at = r.output.find(" padding elements");
  REQUIRE(at != std::string::npos);
  const auto plus = r.output.rfind("+ ", at);
  return std::atol(r.output.c_str() + plus + 2);
}

void zero_parity(int zero, int dp, int mb, int grad_accum, bool with_control) {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(dp * mb * grad_accum);
  const std::string name = "zero" + std::to_string(zero) + "_dp" + std::to_string(dp) +
                           (grad_accum > 1 ? "_ga" + std::to_string(grad_accum) : "");
  const auto sets = with(ranks(dp, mb), {stage_set(zero), "train.grad_accum=" + std::to_string(grad_accum)});
  const RunResult& run = cached(name, sets);
  CHECK(run.output.find("ZeRO-" + std::to_string(zero)) != std::string::npos);
  CHECK(run.output.find("dp(" + std::to_string(dp) + ")") != std::string::npos);
  MESSAGE(name << ": " << padding_of(run) << " padding elements in its flat buffers (all units); comm_path "
               << run.comm_path);
  CHECK(run.comm_path.find("\"dp\": \"shm\"") != std::string::npos);  // one node: shared memory
  if (dp == 3) CHECK(padding_of(run) > 0);  // the case the dp = 3 runs are for
  // ZeRO-3 on one machine: the parameters in the dp group's shared segment.
  if (zero == 3) CHECK(run.output.find("one shared-memory segment") != std::string::npos);
  const std::string what = name + " vs dp1 mb" + std::to_string(dp * mb * grad_accum);
  if (with_control)
    compare(what, run, launch_without_grad_sync(p.dir, name, sets), ref);
  else
    compare(what, run, nullptr, ref);
}

}  // namespace

TEST_CASE("zero parity: stages 1, 2, 3 at dp 4 (4 x mb 2 vs 1 x mb 8), with negative controls") {
  for (int zero : {1, 2, 3}) zero_parity(zero, 4, 2, 1, /*with_control=*/true);
}

TEST_CASE("zero parity: stages 1, 2, 3 at dp 4 with grad_accum 2 (vs 1 x mb 16)") {
  for (int zero : {1, 2, 3}) zero_parity(zero, 4, 2, 2, false);
}

TEST_CASE("zero parity: stages 1, 2, 3 at dp 3, padded shards (vs 1 x mb 6), and grad_accum 2 (vs 1 x mb 12)") {
  for (int zero : {1, 2, 3}) zero_parity(zero, 3, 2, 1, false);
  for (int zero : {1, 2, 3}) zero_parity(zero, 3, 2, 2, false);
}

// The gathering path (ZeRO-3 across machines, on GPUs, with offload) on one
// machine: parallel.fsdp.shared_params false.
TEST_CASE("zero parity: ZeRO-3 gathering (shared_params false), with reshard_after_forward false and prefetch off; "
          "the same bits as the shared parameters") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  const std::string gather = "parallel.fsdp.shared_params=false";
  const auto gathered = cached("zero3_gathered", with(ranks(4, 2), {stage_set(3), "train.grad_accum=1", gather}));
  CHECK(gathered.output.find("reshard_after_forward on, prefetch on") != std::string::npos);
  CHECK(gathered.output.find("shared-memory segment") == std::string::npos);
  compare("zero3 dp4 gathering vs dp1 mb8", gathered, nullptr, ref);
  // The shared segment holds the bits the gathers copy: every step's loss
  // and grad norm identical, not just within the tolerance.
  const auto shared = cached("zero3_dp4", with(ranks(4, 2), {stage_set(3), "train.grad_accum=1"}));
  REQUIRE(shared.losses.size() == gathered.losses.size());
  REQUIRE(shared.grad_norms.size() == gathered.grad_norms.size());
  double d = 0;
  for (size_t i = 0; i < shared.losses.size(); ++i)
    d = std::max({d, std::abs(shared.losses[i] - gathered.losses[i]),
                  std::abs(shared.grad_norms[i] - gathered.grad_norms[i])});
  MESSAGE("zero3 dp4 shared parameters vs gathered: max |loss or grad-norm diff| " << d << " over "
          << shared.losses.size() << " steps (tolerance 0)");
  CHECK(d == 0);
  const auto keep = cached("zero3_keep", with(ranks(4, 2), {stage_set(3), gather,
                                                            "parallel.fsdp.reshard_after_forward=false"}));
  CHECK(keep.output.find("reshard_after_forward off") != std::string::npos);
  compare("zero3 dp4 reshard_after_forward off vs dp1 mb8", keep, nullptr, ref);
  const auto noprefetch = cached("zero3_noprefetch", with(ranks(4, 2), {stage_set(3), gather,
                                                                        "parallel.fsdp.prefetch=false"}));
  CHECK(noprefetch.output.find("prefetch off") != std::string::npos);
  compare("zero3 dp4 prefetch off vs dp1 mb8", noprefetch, nullptr, ref);
}

TEST_CASE("zero parity: ZeRO-2 at dp 2 over Gloo with cluster.shm false (the multi-node path on one node)") {
  auto& p = Parity::get();
  const RunResult& run = cached("zero2_dp2_gloo", with(ranks(2, 4), {stage_set(2), "cluster.shm=false"}));
  MESSAGE("zero2_dp2_gloo: comm_path " << run.comm_path);
  CHECK(run.comm_path.find("\"dp\": \"gloo\"") != std::string::npos);
  CHECK(run.comm_path.find("shm") == std::string::npos);
  compare("zero2 dp2 over Gloo (shm false) vs dp1 mb8", run, nullptr, p.reference(8));
}

TEST_CASE("zero at dp 1 runs, says it has nothing to shard, and matches the reference") {
  auto& p = Parity::get();
  const RunResult& run = cached("zero3_dp1", with(ranks(1, 8), {stage_set(3)}));
  CHECK(run.output.find("nothing to shard") != std::string::npos);
  compare("zero3 dp1 vs dp1 mb8 (DDP)", run, nullptr, p.reference(8));
}

TEST_CASE("memory: rank 0's persistent bytes at dp 4 follow the fp32-Adam formulas") {
  // P from the start-up line; the formulas per parameter: 4 bytes parameter,
  // 4 gradient, 8 optimizer; N = 4. Padding only adds (at most N - 1
  // elements per unit and buffer), so measured >= formula and within 5%.
  const int n = 4;
  struct Stage {
    int zero;
    double params, grads, optimizer;  // bytes per parameter
  };
  const std::vector<Stage> stages = {{0, 4, 4, 8}, {1, 4, 4, 8.0 / n}, {2, 4, 4.0 / n, 8.0 / n},
                                     {3, 4.0 / n, 4.0 / n, 8.0 / n}};
  for (const Stage& st : stages) {
    const std::string name = st.zero == 0 ? "ddp_dp4" : "zero" + std::to_string(st.zero) + "_dp4";
    const RunResult& r = cached(name, with(ranks(4, 2), {stage_set(st.zero), "train.grad_accum=1"}));
    const auto at = r.output.find("model gpt: ");
    REQUIRE(at != std::string::npos);
    const double P = std::atof(r.output.c_str() + at + 11);
    const std::string metrics = Parity::get().dir / name + "/metrics.jsonl";
    const double params = read_metric(metrics, "param_bytes").back();
    const double grads = read_metric(metrics, "grad_bytes").back();
    const double optimizer = read_metric(metrics, "optimizer_bytes").back();
    const double peak = read_metric(metrics, "peak_bytes").back();
    const double measured = params + grads + optimizer;
    const double formula = (st.params + st.grads + st.optimizer) * P;
    MESSAGE("zero " << st.zero << " dp 4, P = " << P << ": params " << params << " B (formula "
                    << st.params * P << "), grads " << grads << " (" << st.grads * P << "), optimizer "
                    << optimizer << " (" << st.optimizer * P << "); persistent " << measured
                    << " = " << measured / P << " B/param vs formula " << formula / P
                    << "; step peak " << peak << " B");
    CHECK(params >= st.params * P);
    CHECK(params <= st.params * P * 1.05);
    CHECK(grads >= st.grads * P);
    CHECK(grads <= st.grads * P * 1.05);
    CHECK(optimizer <= st.optimizer * P * 1.05);
    CHECK(optimizer >= st.optimizer * P * 0.95);
  }
}

TEST_CASE("memory: rank 0's step peak at dp 4 is the plan's within 6%, counting its shared-memory buffers") {
  // The trainer's "memory plan vs measured" line (after step 2): the plan's
  // peak against the counting allocator's peak plus shm_bytes (DDP's
  // buckets, ZeRO-1's flat gradients, ZeRO-2/3's reduce-scatter pool and
  // ZeRO-3's share of the shared parameters, all in /dev/shm). The control:
  // the allocator's peak alone, which those buffers' bytes put >= 10% off.
  for (int zero = 0; zero <= 3; ++zero) {
    const std::string name = zero == 0 ? "ddp_dp4" : "zero" + std::to_string(zero) + "_dp4";
    const RunResult& r = cached(name, with(ranks(4, 2), {stage_set(zero), "train.grad_accum=1"}));
    const std::string tag = "memory plan vs measured after step 2 (rank 0): ";
    const auto at = r.output.find(tag);
    REQUIRE_MESSAGE(at != std::string::npos, r.output);
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    const auto peak_at = line.find(", peak ");
    REQUIRE(peak_at != std::string::npos);
    const double predicted = std::atof(line.c_str() + peak_at + 7);
    const auto slash = line.find("predicted / ", peak_at);
    REQUIRE(slash != std::string::npos);
    const double measured = std::atof(line.c_str() + slash + 12);
    const std::string metrics = Parity::get().dir / name + "/metrics.jsonl";
    const double shm = read_metric(metrics, "shm_bytes").front();
    const double off = predicted / measured - 1, control = predicted / (measured - shm) - 1;
    MESSAGE("zero " << zero << ": plan " << predicted << " B, measured " << measured << " B (" << 100 * off
                    << "%), of which shm " << shm << " B; the allocator alone " << measured - shm << " B ("
                    << 100 * control << "%)");
    CHECK(shm > 0);
    CHECK(std::fabs(off) <= 0.06);
    CHECK(control >= 0.10);
  }
}

TEST_CASE("ZeRO-3 SIGKILLed after step 12 restarts from step 10 bit-exactly; its dp=4 checkpoint resumes as DDP at dp 2") {
  auto& p = Parity::get();
  const auto zero3 = with(ranks(4, 2), {stage_set(3), "train.grad_accum=1"});
  const RunResult& straight = cached("zero3_dp4", zero3);
  const auto want = losses_by_step(p.dir / "zero3_dp4/metrics.jsonl");
  REQUIRE(want.size() == size_t(kSteps));

  // Rank 1 dies by SIGKILL after step 12; the agent restarts every worker,
  // which resume from step_10.
  auto [code, output] = launch_raw("zero3_killed", with(zero3, {"checkpoint.every=5", "checkpoint.keep=10", "cluster.max_restarts=1",
                                                                 "fault.kind=kill_after_step", "fault.rank=1",
                                                                 "fault.step=12"}));
  INFO("killed run output:\n" << output);
  REQUIRE(code == 0);
  CHECK(output.find("resuming from step 10") != std::string::npos);
  const auto got = losses_by_step(p.dir / "zero3_killed/metrics.jsonl");
  REQUIRE(got.size() == size_t(kSteps));
  int differ = 0;
  for (auto& [step, loss] : want) differ += got.at(step) != loss;  // bit for bit: printed with %.17g
  MESSAGE("ZeRO-3 restart: " << differ << " of " << kSteps << " losses differ from the straight run");
  CHECK(differ == 0);
  const auto params = dtrain::testing::read_checkpoint_params(p.dir / "zero3_killed/ckpt", p.dir.path());
  REQUIRE(params.size() == straight.params.size());
  size_t unequal = 0;
  for (auto& [name, v] : straight.params) unequal += params.at(name) != v;
  CHECK(unequal == 0);

  // step_10 of that ZeRO-3 dp=4 run, resumed by DDP on 2 ranks x mb 4.
  auto [code2, output2] = launch_raw("ddp2_from_zero3", with(ranks(2, 4), {stage_set(0), "checkpoint.every=0"}),
                                     {"--resume-from", p.dir / "zero3_killed/ckpt/step_10"});
  INFO("resumed run output:\n" << output2);
  REQUIRE(code2 == 0);
  const ResumeDiffs d = resume_diffs("ddp2_from_zero3", 10, want, straight.params);
  MESSAGE("ZeRO-3 dp4 step_10 -> DDP dp2: max loss rel diff " << d.loss_rel << " over steps 11-20 (tol "
                                                            << kLossRelTol << "), max param abs diff "
                                                            << d.param_abs << " (tol " << kParamAbsTol << ")");
  CHECK(d.loss_rel <= kLossRelTol);
  CHECK(d.param_abs <= kParamAbsTol);
  // The negative control: the same resume with AdamW's moments zeroed on load.
  auto [code3, output3] = launch_raw("ddp2_from_zero3_reset", with(ranks(2, 4), {stage_set(0), "checkpoint.every=0",
                                                                                "fault.kind=reset_moments_on_load"}),
                                     {"--resume-from", p.dir / "zero3_killed/ckpt/step_10"});
  INFO("control output:\n" << output3);
  REQUIRE(code3 == 0);
  check_resume_control("ZeRO-3 dp4 step_10 -> DDP dp2", resume_diffs("ddp2_from_zero3_reset", 10, want, straight.params));
}

TEST_CASE("bad input: zero outside 0..3 exits 2 naming the field; a ZeRO checkpoint in another model names the tensor") {
  auto [code, output] = launch_raw("zero_bad_stage", with(ranks(2, 4), {stage_set(4)}));
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("parallel.zero") != std::string::npos);

  // The ZeRO-3 checkpoint from the parity run, into a wider model.
  auto& p = Parity::get();
  cached("zero3_dp4", with(ranks(4, 2), {stage_set(3), "train.grad_accum=1"}));
  auto [code2, output2] = launch_raw("zero_wrong_model", with(ranks(2, 4), {stage_set(3), "model.d_model=64"}),
                                     {"--resume-from", p.dir / "zero3_dp4/ckpt/step_" + std::to_string(kSteps)});
  INFO(output2);
  CHECK(code2 != 0);
  CHECK(output2.find("does not match this run's model") != std::string::npos);
  CHECK(output2.find("tensor model/wte.weight is F32 [256, 32] in the checkpoint but F32 [256, 64]") !=
        std::string::npos);
}
