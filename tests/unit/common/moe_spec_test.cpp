// model.moe in the job spec: defaults, every bad input with the field, the
// value and the fix (exit code 2), and the relations to parallel.ep.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "tests/support/spec_errors.h"

using dtrain::parse_job_spec;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return dtrain::testing::config_error_of(text, "m.yaml", overrides);
}

using dtrain::testing::has;

const std::string kMoe =
    "cluster: {nodes: 1, procs_per_node: 4}\n"
    "parallel: {dp: 4, ep: 2}\n"
    "model: {layers: 2, d_model: 32, heads: 2, moe: {experts: 4, top_k: 2}}\n";

}  // namespace

TEST_CASE("moe spec: defaults are dense, and a valid MoE spec loads") {
  dtrain::JobSpec d = parse_job_spec("", "d.yaml");
  CHECK(d.model.moe.experts == 0);
  CHECK(d.model.moe.top_k == 1);
  CHECK(d.model.moe.capacity_factor == 1.25);
  CHECK(d.model.moe.aux_loss_coef == 0.01);
  CHECK(d.model.moe.every == 1);
  CHECK(d.model.moe.balance == dtrain::MoeBalance::aux);
  CHECK(error_of(kMoe) == "");
  dtrain::JobSpec s = parse_job_spec(kMoe, "m.yaml", {"model.moe.balance=bias", "model.moe.every=2"});
  CHECK(s.model.moe.experts == 4);
  CHECK(s.model.moe.top_k == 2);
  CHECK(s.model.moe.balance == dtrain::MoeBalance::bias);
  CHECK(s.model.moe.every == 2);
}

TEST_CASE("moe spec: an unknown balance is an error for a dense model too") {
  CHECK(has(error_of("model: {moe: {balance: bais}}"), "model.moe.balance = bais: must be aux or bias (did you mean bias?)"));
}

TEST_CASE("moe spec: experts not divisible by ep") {
  std::string e = error_of(kMoe, {"model.moe.experts=6", "parallel.ep=4"});
  CHECK(has(e, "--set model.moe.experts=6: model.moe.experts = 6 is not divisible by parallel.ep = 4"));
  CHECK(has(e, "use a multiple of 4 experts"));
}

TEST_CASE("moe spec: ep > 1 with a dense model names model.moe.experts") {
  std::string e = error_of("cluster: {procs_per_node: 4}\nparallel: {dp: 4, ep: 2}\n");
  CHECK(has(e, "m.yaml"));
  CHECK(has(e, "model.moe.experts = 0 (a dense model) with parallel.ep = 2"));
  CHECK(has(e, "set model.moe.experts to a multiple of 2"));
}

TEST_CASE("moe spec: top_k, capacity_factor, aux_loss_coef, every, balance, bias_rate") {
  std::string e = error_of(kMoe, {"model.moe.top_k=5"});
  CHECK(has(e, "model.moe.top_k = 5: must be in [1, model.moe.experts = 4]"));
  CHECK(has(error_of(kMoe, {"model.moe.top_k=0"}), "model.moe.top_k = 0"));
  e = error_of(kMoe, {"model.moe.capacity_factor=0"});
  CHECK(has(e, "model.moe.capacity_factor = 0.0: must be > 0"));
  CHECK(has(error_of(kMoe, {"model.moe.capacity_factor=-1.5"}), "model.moe.capacity_factor = -1.5"));
  CHECK(has(error_of(kMoe, {"model.moe.aux_loss_coef=-0.1"}), "model.moe.aux_loss_coef = -0.1: must be >= 0"));
  CHECK(has(error_of(kMoe, {"model.moe.every=0"}), "model.moe.every = 0: must be >= 1"));
  e = error_of(kMoe, {"model.moe.balance=bais"});
  CHECK(has(e, "model.moe.balance = bais: must be aux or bias"));
  CHECK(has(e, "did you mean"));
  CHECK(has(error_of(kMoe, {"model.moe.bias_rate=-1"}), "model.moe.bias_rate = -1"));
  CHECK(has(error_of(kMoe, {"model.moe.d_ff=-1"}), "model.moe.d_ff = -1: must be >= 0"));
  CHECK(has(error_of(kMoe, {"model.moe.experts=-2", "parallel.ep=1"}), "model.moe.experts = -2: must be >= 0"));
}

TEST_CASE("moe spec: problems are collected together, unknown keys refused") {
  std::string e = error_of(kMoe, {"model.moe.top_k=9", "model.moe.capacity_factor=0"});
  CHECK(has(e, "model.moe.top_k = 9"));
  CHECK(has(e, "model.moe.capacity_factor = 0.0"));
  e = error_of("model: {moe: {experts: 4, topk: 2}}\n");
  CHECK(has(e, "model.moe.topk"));
}
