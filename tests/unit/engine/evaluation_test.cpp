// Unit tests of engine/trainer/evaluation.h's data side: data.valid.split
// holds out the last windows of data.path (the training sampler's count
// excludes them, the validation source starts after them), a split too
// small to hold out one window and more windows than the source holds are
// config errors naming the field; data.valid.blend's files get the first
// windows by data.blend's rule, and a short or missing file is refused.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
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

// Two byte files: a.txt of 10 windows, b.txt of 3 (seq_len 16: 17 bytes a window).
TEST_CASE("data.valid.blend: the first K positions split over the files by data.blend's rule, each file from its "
          "first window") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_eval_blend_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.txt") << std::string(10 * 16 + 1, 'a');
  std::ofstream(dir / "b.txt") << std::string(3 * 16 + 1, 'b');
  dtrain::JobSpec spec;
  spec.model.seq_len = 16;
  spec.model.vocab = 256;
  spec.data.valid.blend = {{(dir / "a.txt").string(), 0.7}, {(dir / "b.txt").string(), 0.3}};
  const auto train = dtrain::engine::data::open_dataset("synthetic", "", 16, 256, 1);
  const auto src = dtrain::engine::trainer::eval_sources(spec, *train, 10);
  REQUIRE(src.size() == 2);
  CHECK(src[0].name == "a.txt");
  CHECK(src[1].name == "b.txt");
  CHECK(src[0].windows == 7);  // Megatron's rule: 7 of the first 10 positions for weight 0.7
  CHECK(src[1].windows == 3);
  CHECK(src[0].first == 0);
  CHECK(src[1].first == 0);
  CHECK(src[0].available == 10);
  CHECK(src[1].available == 3);
  // A file the first position alone never reaches gets 0 windows.
  CHECK(dtrain::engine::trainer::eval_sources(spec, *train, 1)[1].windows == 0);
  // 12 positions draw 4 from b.txt, which holds 3.
  try {
    dtrain::engine::trainer::eval_sources(spec, *train, 12);
    FAIL("more windows of a file than it holds must be refused");
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.message()).find("draws 4 windows from data.valid.blend[1] = " + (dir / "b.txt").string()) !=
          std::string::npos);
  }
  spec.data.valid.blend[1].path = (dir / "missing.txt").string();
  try {
    dtrain::engine::trainer::eval_sources(spec, *train, 10);
    FAIL("a missing file must be refused");
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.message()).find("data.valid.blend[1].path = " + (dir / "missing.txt").string()) !=
          std::string::npos);
  }
  fs::remove_all(dir);
}
