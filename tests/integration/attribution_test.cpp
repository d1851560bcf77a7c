// Hang attribution end to end: the builtin engine at dp 3 on one machine,
// rank 2 stopping for good after step 5 (fault.kind hang). Every worker's
// collective trace reaches the rendezvous with the heartbeats; after
// cluster.hang_timeout_s without progress it names rank 2, the collective
// the others wait in and what rank 2 did last, on every node's root-cause
// block, and stops the job (max_restarts 0) or restarts it (max_restarts 1).
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>

#include "tests/support/child.h"
#include "tests/support/parity.h"

namespace parity = dtrain::testing::parity;

namespace {

constexpr double kHangTimeout = 3, kHeartbeat = 0.5;

std::vector<std::string> hang_sets(int max_restarts) {
  auto sets = parity::ranks(3, 4);
  sets.insert(sets.end(), {"fault.kind=hang", "fault.rank=2", "fault.step=5",
                           "cluster.hang_timeout_s=" + std::to_string(kHangTimeout),
                           "cluster.rendezvous.heartbeat_s=" + std::to_string(kHeartbeat),
                           "cluster.max_restarts=" + std::to_string(max_restarts),
                           "cluster.grace_s=1"});
  return sets;
}

}  // namespace

TEST_CASE("hang at dp 3: rank 2 and the collective are named once hang_timeout passes without progress") {
  auto [code, out] = parity::launch_raw("hang_stop", hang_sets(0));
  INFO(out);
  CHECK(code != 0);
  CHECK(out.find("rank(s) 0,1 wait in dp all_reduce #") != std::string::npos);
  CHECK(out.find("rank(s) 2 never entered it") != std::string::npos);
  CHECK(out.find("rank 2 on node 0 (127.0.0.1") != std::string::npos);
  // Its last completed: the previous step's preemption flag (an async world
  // all-reduce waited for at the start of the checkpoint phase).
  CHECK(out.find("step 5, phase checkpoint, last completed collective: world all_reduce #") !=
        std::string::npos);
  CHECK(out.find("Root cause (as the rendezvous tells every node)") != std::string::npos);
  // The stall the rendezvous measured when it declared the hang (its clock).
  std::smatch m;
  const std::regex stalled("no rank completed a collective for ([0-9.]+) s");
  REQUIRE(std::regex_search(out, m, stalled));
  const double took = std::stod(m[1]);
  MESSAGE("hang declared after " << took << " s without progress (hang_timeout_s " << kHangTimeout
                                 << ", heartbeat " << kHeartbeat << " s)");
  // Not before the timeout; how soon after it is the rendezvous's logic,
  // checked on an injected clock (hang_attribution_test.cpp), not here
  // where a loaded machine delays the heartbeats.
  CHECK(took >= kHangTimeout);
}

TEST_CASE("hang with max_restarts 1: the job restarts from its checkpoint and finishes") {
  auto sets = hang_sets(1);
  sets.push_back("checkpoint.every=5");
  auto [code, out] = parity::launch_raw("hang_restart", sets);
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("rank(s) 2 never entered it") != std::string::npos);
  // No grace_s for workers that wait in a collective that cannot finish.
  CHECK(out.find("stopping 3 worker(s) with SIGKILL now: the round ended on a hang") != std::string::npos);
  const auto losses = parity::losses_by_step(parity::Parity::get().dir / "hang_restart/metrics.jsonl");
  CHECK(losses.size() == size_t(parity::kSteps));
}

TEST_CASE("straggler: a slow rank 1 at dp 3 is slowest_rank in metrics.jsonl, and warned about") {
  auto sets = parity::ranks(3, 4);
  sets.insert(sets.end(), {"fault.kind=slow", "fault.rank=1", "fault.step=1", "fault.ms=150",
                           "train.steps=6"});
  auto [code, out] = parity::launch_raw("straggler", sets);
  INFO(out);
  REQUIRE(code == 0);
  const std::string metrics = parity::Parity::get().dir / "straggler/metrics.jsonl";
  const auto slowest = parity::read_metric(metrics, "slowest_rank");
  const auto ratio = parity::read_metric(metrics, "straggler_ratio");
  REQUIRE(slowest.size() == 6);
  REQUIRE(ratio.size() == 6);
  double min_ratio = 1e9;
  for (size_t i = 0; i < slowest.size(); ++i) {
    CHECK(slowest[i] == 1);
    min_ratio = std::min(min_ratio, ratio[i]);
  }
  MESSAGE("slow rank 1 (+150 ms per step): smallest straggler_ratio over 6 steps " << min_ratio);
  CHECK(min_ratio > 1.2);
  CHECK(out.find("straggler: rank 1 computes") != std::string::npos);
}
