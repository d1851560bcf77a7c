// DDP parity (docs/ARCHITECTURE.md, 'What counts as working' and 'The parity
// recipe'): the real `dtrain launch` with 4 Gloo ranks against a 1-process run of
// the same spec and global batch, dropout 0, fp32, 20 steps. Every step's loss
// must match within 1e-5 relative and the final parameters (merged from each
// run's checkpoint) within 1e-5 absolute; each case prints the max differences it
// saw next to the tolerance, and beside them a negative control: the same DDP run
// with gradient synchronisation disabled (the spec's fault.kind no_grad_sync)
// must miss the reference by >= 100x the tolerance, or the comparison could not
// tell right from wrong. The harness is tests/support/parity.h; this file adds
// the DDP layout checks (ranks, buckets, overlap) and the collectives' path from
// metrics.jsonl's comm_path: shared memory by default, Gloo's TCP with
// cluster.shm false (one 2-rank case; its control is the dp 4 one's).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing::parity;

// The DDP run really used 4 ranks and several buckets, and launched them
// from the backward hooks in every step (overlap on) or in none (off).
void check_layout(const RunResult& r, bool overlap) {
  CHECK(r.output.find("dp(4)") != std::string::npos);
  auto at = r.output.find(" bucket(s)");
  REQUIRE(at != std::string::npos);
  auto start = r.output.rfind(' ', at - 1);
  const int buckets = std::atoi(r.output.c_str() + start + 1);
  CHECK(buckets > 1);
  REQUIRE(r.buckets_in_backward.size() == size_t(kSteps));
  const auto [lo, hi] = std::minmax_element(r.buckets_in_backward.begin(), r.buckets_in_backward.end());
  const std::string mode = overlap ? "on" : "off";
  MESSAGE("buckets launched in backward per step: " << *lo << " to " << *hi << " of " << buckets
                                                    << " (overlap " << mode << ")");
  if (overlap)
    CHECK(*lo > 0);
  else
    CHECK(*hi == 0);
}

const std::vector<std::string> kFourRanks = ranks(4, 2);

}  // namespace

TEST_CASE("ddp parity: 4 ranks x micro_batch 2 vs 1 process x micro_batch 8") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  RunResult ddp = launch(p.dir, "ddp4", kFourRanks);
  check_layout(ddp, true);
  MESSAGE("ddp4: comm_path " << ddp.comm_path);
  CHECK(ddp.comm_path.find("\"dp\": \"shm\"") != std::string::npos);  // one node: shared memory
  compare("dp4 mb2 vs dp1 mb8", ddp, launch_without_grad_sync(p.dir, "ddp4", kFourRanks), ref);
}

TEST_CASE("ddp parity over Gloo with cluster.shm false (the multi-node path on one node): 2 ranks x mb 4") {
  auto& p = Parity::get();
  RunResult ddp = launch(p.dir, "ddp2_gloo", with(ranks(2, 4), {"cluster.shm=false"}));
  MESSAGE("ddp2_gloo: comm_path " << ddp.comm_path);
  CHECK(ddp.comm_path.find("\"dp\": \"gloo\"") != std::string::npos);
  CHECK(ddp.comm_path.find("shm") == std::string::npos);
  compare("dp2 mb4 over Gloo (shm false) vs dp1 mb8", ddp, nullptr, p.reference(8));
}

TEST_CASE("ddp parity: grad_accum 2 (4 ranks x 2 x 2 vs 1 process x 16)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(16);
  const auto sets = with(kFourRanks, {"train.grad_accum=2"});
  RunResult ddp = launch(p.dir, "ddp4_ga2", sets);
  check_layout(ddp, true);
  compare("dp4 mb2 ga2 vs dp1 mb16", ddp, launch_without_grad_sync(p.dir, "ddp4_ga2", sets), ref);
}

TEST_CASE("ddp parity: overlap off (all-reduce after backward)") {
  auto& p = Parity::get();
  const RunResult& ref = p.reference(8);
  const auto sets = with(kFourRanks, {"parallel.ddp.overlap=false"});
  RunResult ddp = launch(p.dir, "ddp4_no_overlap", sets);
  check_layout(ddp, false);
  compare("dp4 mb2 overlap off vs dp1 mb8", ddp,
          launch_without_grad_sync(p.dir, "ddp4_no_overlap", sets), ref);
}
