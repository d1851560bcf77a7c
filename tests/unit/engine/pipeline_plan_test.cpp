// Unit tests of engine/parallel/pipeline/plan: every gpipe and 1f1b plan for
// p = 1..4, m = 1..8 (and interleaved ones) passes the simulator with the
// in-flight counts and bubble that theory predicts; hand-broken plans (missing
// receive, deadlock, wrong or reordered send, missing backward) are rejected
// with a message naming the rank and action; bad specs name their field.
#include "plan/pipeline_plan.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

using dtrain::Error;
using dtrain::ErrorCode;
using namespace dtrain::plan::pipeline;
using dtrain::PipelineSchedule;

namespace {

std::string spec_error(const PlanSpec& spec) {
  try {
    build_plan(spec);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    return e.message();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The simulator must accept `plan` as built and reject `broken` with a
// message containing `expect`: the first is the control that shows the
// rejection comes from the change.
void check_rejected(const PlanSpec& spec, const Plan& broken, const std::string& expect) {
  CHECK(simulate(spec, build_plan(spec)).ok);
  SimResult r = simulate(spec, broken);
  INFO("error: " << r.error);
  CHECK_FALSE(r.ok);
  CHECK(contains(r.error, expect));
}

}  // namespace

TEST_CASE("pipeline plan: gpipe and 1f1b pass the simulator with the ideal bubble") {
  for (PipelineSchedule kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m) {
        PlanSpec spec{kind, p, m, 1};
        SimResult r = simulate(spec, build_plan(spec));
        INFO(to_string(kind) << " p=" << p << " m=" << m << ": " << r.error);
        REQUIRE(r.ok);
        REQUIRE(r.max_in_flight.size() == static_cast<size_t>(p));
        for (int rank = 0; rank < p; ++rank)
          CHECK(r.max_in_flight[rank] == (spec.kind == PipelineSchedule::gpipe ? m : std::min(p - rank, m)));
        // Forward 1 tick, backward 2: every rank computes 3m ticks of
        // 3(m+p-1), so the idle fraction is exactly (p-1)/(m+p-1) for both.
        CHECK(r.ticks == 3 * (m + p - 1));
        CHECK(std::abs(r.bubble - ideal_bubble(spec)) < 1e-12);
      }
}

TEST_CASE("pipeline plan: interleaved 1f1b passes the simulator with the ideal bubble") {
  for (int p = 2; p <= 4; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 8; m += p) {
        PlanSpec spec{PipelineSchedule::interleaved_1f1b, p, m, v};
        SimResult r = simulate(spec, build_plan(spec));
        INFO("p=" << p << " v=" << v << " m=" << m << ": " << r.error);
        REQUIRE(r.ok);
        for (int rank = 0; rank < p; ++rank) {
          int warmup = m == p ? v * m : std::min(2 * (p - rank - 1) + (v - 1) * p, v * m);
          CHECK(r.max_in_flight[rank] == std::min(warmup + 1, v * m));
        }
        CHECK(r.ticks == 3 * (v * m + p - 1));
        CHECK(std::abs(r.bubble - ideal_bubble(spec)) < 1e-12);
        CHECK(r.bubble < ideal_bubble({PipelineSchedule::one_f_one_b, p, m, 1}));
      }
  // v = 1 is the non-interleaved schedule.
  PlanSpec one{PipelineSchedule::interleaved_1f1b, 3, 5, 1};
  PlanSpec plain{PipelineSchedule::one_f_one_b, 3, 5, 1};
  CHECK(format_plan(one, build_plan(one)) == format_plan(plain, build_plan(plain)));
}

TEST_CASE("pipeline plan: zb_h1 splits every backward, holds 1F1B's peak in flight, and beats 1F1B's bubble") {
  for (int p = 1; p <= 4; ++p)
    for (int m = 1; m <= 8; ++m) {
      PlanSpec spec{PipelineSchedule::zb_h1, p, m, 1};
      const Plan plan = build_plan(spec);
      SimResult r = simulate(spec, plan);
      SimResult f = simulate({PipelineSchedule::one_f_one_b, p, m, 1}, build_plan({PipelineSchedule::one_f_one_b, p, m, 1}));
      INFO("zb_h1 p=" << p << " m=" << m << ": " << r.error);
      REQUIRE(r.ok);
      for (int rank = 0; rank < p; ++rank) {
        CHECK(r.max_in_flight[rank] <= std::min(p, m));  // 1F1B's stage-0 peak
        int inputs = 0, weights = 0, whole = 0;
        for (const Action& a : plan[rank]) {
          inputs += a.op == Op::backward_input;
          weights += a.op == Op::backward_weight;
          whole += a.op == Op::backward;
        }
        CHECK(inputs == m);
        CHECK(weights == m);
        CHECK(whole == 0);
      }
      // The same compute (3m ticks a rank), in less time than 1F1B for p > 1.
      if (p > 1) CHECK(r.ticks < f.ticks);
      else CHECK(r.ticks == f.ticks);
      CHECK(r.bubble >= ideal_bubble(spec) - 1e-12);
      if (m == p || (p == 2 && m % 2 == 0)) CHECK(std::abs(r.bubble - ideal_bubble(spec)) < 1e-12);
      if (p == 4 && m == 8)
        MESSAGE("p 4, m 8: zb_h1 " << r.ticks << " ticks, bubble " << r.bubble << " (Qi et al. " << ideal_bubble(spec)
                                   << "); 1f1b " << f.ticks << " ticks, bubble " << f.bubble);
    }
  PlanSpec spec{PipelineSchedule::zb_h1, 2, 2, 1};
  CHECK(format_plan(spec, build_plan(spec)) ==
        "stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 BI0 W0 RECV_B1 BI1 W1\n"
        "stage 1: RECV_F0 F0 BI0 SEND_B0 RECV_F1 F1 BI1 SEND_B1 W0 W1\n"
        "7 ticks, bubble 0.143 (ideal 0.143), in flight 2 2\n");
}

TEST_CASE("pipeline plan: the simulator rejects hand-broken zb_h1 plans") {
  PlanSpec zb{PipelineSchedule::zb_h1, 2, 2, 1};
  // stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 BI0 W0 RECV_B1 BI1 W1
  // stage 1: RECV_F0 F0 BI0 SEND_B0 RECV_F1 F1 BI1 SEND_B1 W0 W1
  SUBCASE("a weight half before its input half") {
    Plan plan = build_plan(zb);
    std::swap(plan[0][5], plan[0][6]);  // W0 BI0
    check_rejected(zb, plan, "rank 0 #5 W0: comes before BI0, whose gradients it needs");
  }
  SUBCASE("a missing weight half") {
    Plan plan = build_plan(zb);
    plan[1].pop_back();  // W1
    check_rejected(zb, plan, "rank 1 never runs W1");
  }
  SUBCASE("a whole backward after an input half") {
    Plan plan = build_plan(zb);
    plan[1][9] = {Op::backward, 1, 0};  // W1 -> B1
    check_rejected(zb, plan, "rank 1 #9 B1: runs a second backward of this micro-batch");
  }
  SUBCASE("a gradient sent before the input half that produces it") {
    Plan plan = build_plan(zb);
    std::swap(plan[1][2], plan[1][3]);  // SEND_B0 BI0
    check_rejected(zb, plan, "rank 1 #2 SEND_B0: comes before B0, which produces it");
  }
}

TEST_CASE("pipeline plan: format_plan prints p=2 m=2 1f1b exactly") {
  PlanSpec spec{PipelineSchedule::one_f_one_b, 2, 2, 1};
  CHECK(format_plan(spec, build_plan(spec)) ==
        "stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1\n"
        "stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1\n"
        "9 ticks, bubble 0.333 (ideal 0.333), in flight 2 1\n");
  PlanSpec gpipe{PipelineSchedule::gpipe, 2, 2, 1};
  CHECK(format_plan(gpipe, build_plan(gpipe)) ==
        "stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1\n"
        "stage 1: RECV_F0 F0 RECV_F1 F1 B0 SEND_B0 B1 SEND_B1\n"
        "9 ticks, bubble 0.333 (ideal 0.333), in flight 2 2\n");
}

TEST_CASE("pipeline plan: the simulator rejects hand-broken plans") {
  PlanSpec f1b{PipelineSchedule::one_f_one_b, 2, 2, 1};
  PlanSpec gp{PipelineSchedule::gpipe, 2, 2, 1};
  // 1f1b  stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1
  //       stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1
  // gpipe stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1
  //       stage 1: RECV_F0 F0 RECV_F1 F1 B0 SEND_B0 B1 SEND_B1

  SUBCASE("a missing receive") {
    Plan plan = build_plan(f1b);
    plan[1].erase(plan[1].begin() + 4);  // RECV_F1
    check_rejected(f1b, plan, "rank 1 #4 F1: its input was never received");
  }
  SUBCASE("a swapped pair that deadlocks") {
    Plan plan = build_plan(gp);
    std::swap(plan[0][3], plan[0][4]);  // F1 RECV_B0 SEND_F1: waits before it sends
    check_rejected(gp, plan,
                   "deadlock at tick 2:\n"
                   "  rank 0 #3 RECV_B0 waits for SEND_B0 from rank 1\n"
                   "  rank 1 #2 RECV_F1 waits for SEND_F1 from rank 0");
  }
  SUBCASE("a send of the wrong micro") {
    Plan plan = build_plan(gp);
    plan[0][1].micro = 1;  // SEND_F1 right after F0
    check_rejected(gp, plan, "rank 0 #1 SEND_F1: comes before F1, which produces it");
    CHECK(contains(simulate(gp, plan).error, "rank 0 never posts SEND_F0"));
  }
  SUBCASE("sends in the wrong order") {
    Plan plan = build_plan(gp);
    std::swap(plan[0][1], plan[0][2]);  // F0 F1 SEND_F0 SEND_F1: still fine
    CHECK(simulate(gp, plan).ok);
    std::swap(plan[0][2], plan[0][3]);  // F0 F1 SEND_F1 SEND_F0
    check_rejected(gp, plan,
                   "rank 1 #0 RECV_F0: the next message from rank 0 is rank 0 #2 SEND_F1");
  }
  SUBCASE("a micro that never runs backward") {
    Plan plan = build_plan(f1b);
    plan[1].resize(6);  // drops B1 SEND_B1
    check_rejected(f1b, plan, "rank 1 never runs B1");
  }
  SUBCASE("a forward run twice, a send from the last stage, a wrong plan size") {
    Plan plan = build_plan(f1b);
    plan[1][5].micro = 0;  // F1 -> F0
    check_rejected(f1b, plan, "rank 1 #5 F0: runs twice");
    plan = build_plan(f1b);
    plan[1].push_back({Op::send_act, 0});
    check_rejected(f1b, plan, "the last stage has no next stage to send to");
    plan = build_plan(f1b);
    plan.pop_back();
    check_rejected(f1b, plan, "the plan has 1 lists; parallel.pp = 2 needs one per rank");
    plan = build_plan(f1b);
    plan[0][0].micro = 7;
    check_rejected(f1b, plan, "rank 0 #0 F7: micro 7 is outside 0..1");
  }
}

TEST_CASE("pipeline plan: peers of interleaved stages wrap from the last rank to the first") {
  PlanSpec spec{PipelineSchedule::interleaved_1f1b, 2, 4, 2};  // stages: rank 0 = 0, 2; rank 1 = 1, 3
  Peer a = peer(spec, 1, {Op::send_act, 3, 0});  // stage 1 -> 2
  CHECK(a.rank == 0);
  CHECK(a.chunk == 1);
  Peer b = peer(spec, 0, {Op::send_grad, 3, 1});  // stage 2 -> 1
  CHECK(b.rank == 1);
  CHECK(b.chunk == 0);
  Peer c = peer(spec, 0, {Op::recv_grad, 3, 1});  // from stage 3
  CHECK(c.rank == 1);
  CHECK(c.chunk == 1);
  CHECK_THROWS_AS(peer(spec, 0, {Op::recv_act, 0, 0}), Error);  // stage 0 reads data
  CHECK(format_action(spec, {Op::recv_grad, 3, 1}) == "RECV_B3.1");
}

TEST_CASE("pipeline plan: bad specs name the field and the fix") {
  std::string all = spec_error({PipelineSchedule::one_f_one_b, 0, 0, 0});
  CHECK(contains(all, "parallel.pp = 0 must be at least 1"));
  CHECK(contains(all, "train.grad_accum = 0 must be at least 1"));
  CHECK(contains(all, "parallel.pipeline.virtual_stages = 0 must be at least 1"));
  CHECK(contains(spec_error({PipelineSchedule::one_f_one_b, 2, 4, 2}),
                 "parallel.pipeline.virtual_stages = 2 needs parallel.pipeline.schedule = "
                 "interleaved_1f1b (it is 1f1b)"));
  CHECK(contains(spec_error({PipelineSchedule::interleaved_1f1b, 1, 4, 2}), "needs parallel.pp >= 2"));
  CHECK(contains(spec_error({PipelineSchedule::interleaved_1f1b, 4, 6, 2}),
                 "train.grad_accum = 6 is not a multiple of parallel.pp = 4, which "
                 "interleaved_1f1b with virtual_stages > 1 needs; use grad_accum 4 or 8"));
  CHECK(contains(spec_error({PipelineSchedule::interleaved_1f1b, 4, 3, 2}), "use grad_accum 4,"));
  CHECK(spec_error({PipelineSchedule::interleaved_1f1b, 4, 8, 2}) == "(no error)");
  CHECK_THROWS_AS(simulate({PipelineSchedule::gpipe, 0, 1, 1}, Plan{}), Error);
}
