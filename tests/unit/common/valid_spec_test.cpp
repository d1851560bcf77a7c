// data.valid in the job spec: defaults (inactive), a valid path or split,
// and every bad input with the field, the value and the fix (exit code 2).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "tests/support/spec_errors.h"

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return dtrain::testing::config_error_of(text, "v.yaml", overrides);
}

using dtrain::testing::has;

}  // namespace

TEST_CASE("valid spec: inactive by default; a path or a split loads") {
  const dtrain::JobSpec d = dtrain::parse_job_spec("", "d.yaml");
  CHECK_FALSE(d.data.valid.active());
  CHECK(d.data.valid.every == 100);
  CHECK(d.data.valid.batches == 16);
  const dtrain::JobSpec p = dtrain::parse_job_spec("data: {valid: {path: v.txt, every: 5, batches: 3}}\n", "p.yaml");
  CHECK(p.data.valid.active());
  CHECK(p.data.valid.path == "v.txt");
  CHECK(p.data.valid.every == 5);
  CHECK(p.data.valid.batches == 3);
  CHECK(error_of("data: {valid: {split: 0.5}}\n") == "");
  CHECK(error_of("data: {format: synthetic, valid: {split: 0.01}}\n") == "");
}

TEST_CASE("valid spec: bad values name the field, the value and the fix") {
  CHECK(has(error_of("data: {valid: {path: v.txt, every: 0}}\n"), "data.valid.every = 0: must be >= 1"));
  CHECK(has(error_of("data: {format: indexed, path: p, valid: {split: 0.01}}\n"),
            "data.valid.split = 0.01 with data.format = indexed"));
  CHECK(has(error_of("data: {valid: {path: v.txt, batches: 0}}\n"), "data.valid.batches = 0: must be >= 1"));
  CHECK(has(error_of("data: {valid: {split: 0.6}}\n"), "data.valid.split = 0.6: must be in (0, 0.5]"));
  CHECK(has(error_of("data: {valid: {split: -0.1}}\n"), "data.valid.split = -0.1: must be in (0, 0.5]"));
  CHECK(has(error_of("data: {valid: {path: v.txt, split: 0.1}}\n"), "keep the path or the split"));
  CHECK(has(error_of("data: {format: synthetic, valid: {path: v.txt}}\n"),
            "data.valid.path = v.txt with data.format = synthetic"));
  CHECK(has(error_of("data: {valid: {pth: v.txt}}\n"), "data.valid.pth"));
}

TEST_CASE("valid spec: data.valid.blend loads like data.blend, and its bad input names the entry") {
  const dtrain::JobSpec b = dtrain::parse_job_spec(
      "data: {valid: {blend: [{path: va.txt, weight: 0.7}, {path: vb.txt, weight: 0.3}], batches: 10}}\n", "b.yaml");
  CHECK(b.data.valid.active());
  REQUIRE(b.data.valid.blend.size() == 2);
  CHECK(b.data.valid.blend[1].path == "vb.txt");
  CHECK(b.data.valid.blend[1].weight == 0.3);
  CHECK(error_of("data: {format: indexed, path: p, valid: {blend: [{path: q, weight: 1}]}}\n") == "");
  CHECK(has(error_of("data: {valid: {blend: [{path: va, weight: 0}, {path: vb, weight: 1}]}}\n"),
            "data.valid.blend[0].weight = 0.0 (va): must be > 0"));
  CHECK(has(error_of("data: {valid: {blend: [{path: va, weight: -1}]}}\n"),
            "data.valid.blend[0].weight = -1.0 (va): must be > 0"));
  const std::string zeros = error_of("data: {valid: {blend: [{path: va, weight: 0}, {path: vb, weight: 0}]}}\n");
  CHECK(has(zeros, "data.valid.blend[0].weight = 0.0"));
  CHECK(has(zeros, "data.valid.blend[1].weight = 0.0"));
  CHECK(has(error_of("data: {valid: {blend: [{path: '', weight: 1}]}}\n"), "data.valid.blend[0].path is empty"));
  CHECK(has(error_of("data: {valid: {blend: [{path: va}]}}\n"), "data.valid.blend: expected a list like"));
  CHECK(has(error_of("data: {valid: {path: v.txt, blend: [{path: va, weight: 1}]}}\n"),
            "data.valid.blend and data.valid.path are both given"));
  CHECK(has(error_of("data: {valid: {split: 0.1, blend: [{path: va, weight: 1}]}}\n"),
            "data.valid.blend and data.valid.split are both given"));
  CHECK(has(error_of("data: {format: synthetic, valid: {blend: [{path: va, weight: 1}]}}\n"),
            "data.valid.blend with data.format = synthetic"));
}
