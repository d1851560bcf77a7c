// parallel.dp: auto, train.global_batch and train.grad_accum: auto: what they
// resolve to when the spec loads and for a round of fewer nodes, the one-line
// refusals (values and fix), the printed spec and the summary.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "common/spec_resolve.h"
#include "tests/support/spec_errors.h"

using dtrain::JobSpec;
using dtrain::parse_job_spec;
using dtrain::testing::has;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return dtrain::testing::config_error_of(text, "t.yaml", overrides);
}

const std::string kElastic =
    "cluster: {nodes: \"2:3\", procs_per_node: 1}\n"
    "parallel: {dp: auto}\n"
    "train: {micro_batch: 2, global_batch: 12, grad_accum: auto}\n";

}  // namespace

TEST_CASE("spec auto: dp = nodes x procs_per_node / (tp x pp), grad_accum = global_batch / (micro x dp)") {
  JobSpec s = parse_job_spec("cluster: {nodes: 2, procs_per_node: 4}\n"
                             "parallel: {dp: auto, tp: 2}\n"
                             "model: {heads: 4}\n"
                             "train: {micro_batch: 2, global_batch: 32, grad_accum: auto}\n",
                             "t.yaml");
  CHECK(s.parallel.dp_auto);
  CHECK(s.parallel.dp == 4);
  CHECK(s.train.grad_accum_auto);
  CHECK(s.train.grad_accum == 4);
  CHECK(s.global_batch() == 32);
  const std::string summary = dtrain::job_spec_summary(s);
  CHECK(has(summary, "world = dp(4, auto) x tp(2) x pp(1) = 8 ranks"));
  CHECK(has(summary, "GBS = micro_batch(2) x grad_accum(4, auto) x dp(4) = 32 sequences (train.global_batch)"));
  // The printed spec keeps `auto` and loads back to the same numbers.
  const std::string yaml = dtrain::job_spec_to_yaml(s);
  CHECK(has(yaml, "  dp: auto\n"));
  CHECK(has(yaml, "  grad_accum: auto\n"));
  CHECK(has(yaml, "  global_batch: 32\n"));
  JobSpec back = parse_job_spec(yaml, "resolved.yaml");
  CHECK(back.parallel.dp == 4);
  CHECK(back.train.grad_accum == 4);
  // --set works too, and a number turns auto off again.
  JobSpec fixed = parse_job_spec(yaml, "resolved.yaml", {"parallel.dp=4", "train.grad_accum=4"});
  CHECK_FALSE(fixed.parallel.dp_auto);
  CHECK_FALSE(fixed.train.grad_accum_auto);
}

TEST_CASE("spec auto: an elastic range resolves at its largest size; a smaller round re-derives") {
  std::vector<std::string> warnings;
  JobSpec s = parse_job_spec(kElastic, "t.yaml", {}, &warnings);
  CHECK(s.parallel.dp == 3);
  CHECK(s.train.grad_accum == 2);
  CHECK(warnings.empty());
  const JobSpec two = dtrain::spec_for_round(s, 2, 2);
  CHECK(two.parallel.dp == 2);
  CHECK(two.train.grad_accum == 3);  // grows: the global batch stays 12
  CHECK(two.global_batch() == 12);
  CHECK(two.cluster.nodes_min == 2);
  CHECK(two.cluster.nodes_max == 2);
  CHECK_FALSE(two.parallel.dp_auto);
  CHECK_FALSE(two.train.grad_accum_auto);
  CHECK(dtrain::auto_sizes_text(s, two) ==
        "parallel.dp = auto -> 2 (world 2 / (tp 1 x pp 1)), train.grad_accum = auto -> 3 "
        "(global_batch 12 / (micro_batch 2 x dp 2))");
  // What the workers load (DTRAIN_SPEC): the round's numbers, valid as they are.
  JobSpec worker = parse_job_spec(dtrain::job_spec_to_yaml(two), "round.yaml");
  CHECK(worker.parallel.dp == 2);
  CHECK(worker.train.grad_accum == 3);
  CHECK(worker.world() == 2);
  // A fault aimed at rank 2 (on the lost third node) injects nothing in a round
  // of 2; one aimed at a rank the round has is kept.
  JobSpec faulty = parse_job_spec(kElastic, "t.yaml", {"fault.kind=hang", "fault.rank=2", "fault.step=3"});
  const JobSpec lost = dtrain::spec_for_round(faulty, 2, 2);
  CHECK_FALSE(lost.fault.active());
  CHECK_NOTHROW(parse_job_spec(dtrain::job_spec_to_yaml(lost), "round.yaml"));
  CHECK(dtrain::spec_for_round(faulty, 3, 3).fault.rank == 2);
  faulty.fault.rank = 1;
  CHECK(dtrain::spec_for_round(faulty, 2, 2).fault.rank == 1);
}

TEST_CASE("spec auto: refusals name the values and the fix") {
  std::string e = error_of("cluster: {nodes: 3, procs_per_node: 1}\nparallel: {dp: auto, tp: 2}\n"
                           "model: {heads: 4}\n");
  CHECK(has(e, "t.yaml:2:16: parallel.dp = auto: tp(2) x pp(1) = 2 does not divide the world "
               "cluster.nodes(3) x cluster.procs_per_node(1) = 3; use cluster.procs_per_node 2"));
  CHECK(e.find('\n') == std::string::npos);  // one line, no follow-up errors about dp

  e = error_of(kElastic, {"train.global_batch=8"});
  CHECK(has(e, "--set train.global_batch=8: train.grad_accum = auto: train.global_batch(8) is not "
               "a multiple of train.micro_batch(2) x parallel.dp(3) = 6; use train.global_batch 6 "
               "or 12 (multiples of 6)"));
  CHECK(e.find('\n') == std::string::npos);

  e = error_of("train: {grad_accum: auto}\n");
  CHECK(has(e, "train.grad_accum = auto needs train.global_batch"));
  e = error_of("train: {micro_batch: 2, grad_accum: 1, global_batch: 4}\n");
  CHECK(has(e, "train.global_batch = 4 but train.micro_batch(2) x train.grad_accum(1) x "
               "parallel.dp(1) = 2; set train.grad_accum: auto"));
  e = error_of("train: {global_batch: -1}\n");
  CHECK(has(e, "train.global_batch = -1: must be >= 0"));
  e = error_of("parallel: {dp: two}\n");
  CHECK(has(e, "parallel.dp: expected an integer, got 'two'; write it like dp: 1 (the default), or dp: auto"));
}

TEST_CASE("spec auto: elastic sizes that cannot keep the global batch are warned about; a round refuses") {
  std::vector<std::string> warnings;
  // 2:4 nodes, global batch 12, micro 2: dp 4 needs 8 | 12: no; 4 is the
  // largest size, so it is the error; 2:3 with 18 warns about 2 (dp 2: 4 ∤ 18).
  CHECK(has(error_of(kElastic, {"cluster.nodes=\"2:4\""}),
            "train.global_batch(12) is not a multiple of train.micro_batch(2) x parallel.dp(4) = 8"));
  JobSpec s = parse_job_spec(kElastic, "t.yaml", {"train.global_batch=18"}, &warnings);
  CHECK(s.train.grad_accum == 3);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "cluster.nodes = 2:3: a round of 2 (dp 2) node(s) cannot keep this mesh "
                         "and train.global_batch = 18 and would be refused when it forms"));
  bool threw = false;
  try {
    dtrain::spec_for_round(s, 2, 2);
  } catch (const dtrain::Error& e) {
    threw = true;
    CHECK(has(e.message(), "t.yaml: a round of 2 node(s) (dp 2): train.grad_accum = auto: "
                           "train.global_batch(18) is not a multiple of train.micro_batch(2) x "
                           "parallel.dp(2) = 4"));
  }
  CHECK(threw);
  // A fixed grad_accum with train.global_batch: smaller rounds would change it.
  warnings.clear();
  parse_job_spec(kElastic, "t.yaml", {"train.grad_accum=2"}, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "a round of 2 (dp 2) node(s) cannot keep this mesh and train.global_batch = 12"));
  // Elastic with a fixed grad_accum: the global batch follows the nodes (warned).
  warnings.clear();
  parse_job_spec("cluster: {nodes: \"1:2\"}\nparallel: {dp: 2}\n", "t.yaml", {}, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(has(warnings[0], "dp follows the nodes of each round, and so does the global batch"));
}
