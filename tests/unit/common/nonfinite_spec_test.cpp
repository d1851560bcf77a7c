// Spec rules of train.nonfinite (stop | skip_step) and
// train.nonfinite_patience (>= 1): the defaults, the valid values, and
// errors that exit 2 naming the field, the value and the choices; a
// warning when skip_step makes the patience meaningless; the printed spec
// carries both fields back.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "tests/support/spec_errors.h"

namespace {

std::string error_of(const std::vector<std::string>& overrides) {
  const auto e = dtrain::testing::parse_error("model: {layers: 2}\n", "n.yaml", overrides);
  if (e.thrown) CHECK(e.exit_code == 2);
  return e.message;
}

using dtrain::testing::has;

}  // namespace

TEST_CASE("nonfinite spec: defaults stop after 3, valid values load and print back") {
  const dtrain::JobSpec d;
  CHECK(d.train.nonfinite == dtrain::NonfiniteAction::stop);
  CHECK(d.train.nonfinite_patience == 3);
  CHECK(error_of({"train.nonfinite=skip_step", "train.nonfinite_patience=1"}) == "");
  dtrain::JobSpec s;
  s.train.nonfinite = dtrain::NonfiniteAction::skip_step;
  s.train.nonfinite_patience = 7;
  const std::string yaml = dtrain::job_spec_to_yaml(s);
  CHECK(has(yaml, "nonfinite: skip_step"));
  CHECK(has(yaml, "nonfinite_patience: 7"));
}

TEST_CASE("nonfinite spec: a value outside the set, a patience below 1") {
  const std::string e = error_of({"train.nonfinite=ignore", "train.nonfinite_patience=0"});
  CHECK(has(e, "train.nonfinite"));
  CHECK(has(e, "ignore"));
  CHECK(has(e, "skip_step"));
  CHECK(has(e, "train.nonfinite_patience = 0: must be >= 1"));
}

TEST_CASE("nonfinite spec: a patience with skip_step is ignored, and says so") {
  std::vector<std::string> warnings;
  dtrain::parse_job_spec("train: {nonfinite: skip_step, nonfinite_patience: 5}\n", "w.yaml", {}, &warnings);
  bool warned = false;
  for (const auto& w : warnings) warned = warned || has(w, "train.nonfinite_patience = 5 is ignored");
  CHECK(warned);
}
