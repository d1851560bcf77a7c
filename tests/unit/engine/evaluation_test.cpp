// Unit tests of engine/trainer/evaluation.h's data side: data.valid.split
// holds out the last windows of data.path (the training sampler's count
// excludes them, the validation source starts after them), a split too
// small to hold out one window and more windows than the source holds are
// config errors naming the field.
#include <doctest/doctest.h>

#include <string>

#include "common/error.h"
#include "common/job_spec.h"
#include "engine/data/dataset.h"
#include "engine/trainer/evaluation.h"

using dtrain::engine::trainer::eval_source;
using dtrain::engine::trainer::training_windows;

TEST_CASE("data.valid.split: the last windows are held out of training and are the validation windows") {
  dtrain::JobSpec spec;
  CHECK(training_windows(spec, 1000) == 1000);  // no data.valid: every window trains
  spec.data.valid.split = 0.01;
  CHECK(training_windows(spec, 1000) == 990);
  spec.data.valid.split = 0.5;
  CHECK(training_windows(spec, 7) == 4);
  spec.data.valid.split = 0.01;
  try {
    training_windows(spec, 50);
    FAIL("a split of 0.01 of 50 windows holds out none and must be refused");
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.message()).find("data.valid.split") != std::string::npos);
  }

  spec.model.seq_len = 16;
  spec.data.valid.split = 0.1;
  const auto train = dtrain::engine::data::open_dataset("synthetic", "", 16, 256, 1);
  const int64_t n = train->num_samples();
  const auto src = eval_source(spec, *train, 4);
  CHECK(src.data == train.get());
  CHECK(src.first == training_windows(spec, n));
  CHECK(src.first + src.available == n);
  CHECK(src.available == n / 10);
  try {
    eval_source(spec, *train, src.available + 1);
    FAIL("more windows than the held-out part holds must be refused");
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.message()).find("data.valid.batches") != std::string::npos);
  }
}
