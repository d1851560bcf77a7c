// Safe writes (common/safe_output.h, checkpoint_dir's check_outside and
// move_aside) and the job spec's file and size checks: an existing file,
// a symlink, a directory, a path inside the checkpoint being read; a SPEC
// that is a directory or empty; sizes whose products overflow 32 bits.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "common/machine_memory.h"
#include "common/safe_output.h"
#include "plan/combinations.h"
#include "plan/model_size.h"
#include "tests/support/child.h"

namespace fs = std::filesystem;
using dtrain::Clobber;
using dtrain::Error;
using dtrain::ErrorCode;

namespace {

using Tmp = dtrain::testing::TempDir;
using dtrain::testing::read_file;

void spit(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The message of the config error f throws ("" when none).
template <typename F>
std::string config_error(F f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    CHECK(e.exit_code() == 2);
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

}  // namespace

TEST_CASE("safe output: a new file appears whole, an existing one is kept unless replace") {
  Tmp t;
  dtrain::write_file_safely(t / "a.txt", "one\n", "OUT", Clobber::refuse);
  CHECK(read_file(t / "a.txt") == "one\n");
  std::string e = config_error([&] { dtrain::write_file_safely(t / "a.txt", "two\n", "OUT", Clobber::refuse); });
  CHECK(has(e, "OUT = " + (t / "a.txt") + " already exists"));
  CHECK(has(e, "--force"));
  CHECK(read_file(t / "a.txt") == "one\n");
  dtrain::write_file_safely(t / "a.txt", "two\n", "OUT", Clobber::replace);
  CHECK(read_file(t / "a.txt") == "two\n");
  CHECK(entries(t.path()) == 1);  // no temporary left behind
}

TEST_CASE("safe output: never through a symlink, never onto a directory") {
  Tmp t;
  spit(t / "target.txt", "precious\n");
  fs::create_symlink(t / "target.txt", t / "link.txt");
  fs::create_symlink(t / "absent.txt", t / "dangling.txt");
  for (Clobber c : {Clobber::refuse, Clobber::replace}) {
    CHECK(has(config_error([&] { dtrain::write_file_safely(t / "link.txt", "x", "OUT", c); }),
              "is a symbolic link"));
    CHECK(has(config_error([&] { dtrain::write_file_safely(t / "dangling.txt", "x", "OUT", c); }),
              "is a symbolic link"));
    CHECK(has(config_error([&] { dtrain::write_file_safely(t.path(), "x", "OUT", c); }), "not a file"));
  }
  CHECK(read_file(t / "target.txt") == "precious\n");
  CHECK_FALSE(fs::exists(t / "absent.txt"));
  CHECK(has(config_error([&] { dtrain::write_file_safely(t / "no/such/dir/x", "x", "--svg", Clobber::refuse); }),
            "--svg = " + (t / "no/such/dir/x") + ": the directory"));
  CHECK(entries(t.path()) == 3);
}

TEST_CASE("safe output: a file that appears before commit is not replaced") {
  Tmp t;
  dtrain::SafeOutput out(t / "late.txt", "OUT", Clobber::refuse);
  out.write("mine\n");
  spit(t / "late.txt", "theirs\n");
  CHECK(has(config_error([&] { out.commit(); }), "already exists"));
  CHECK(read_file(t / "late.txt") == "theirs\n");
}

TEST_CASE("check_outside: nothing inside the checkpoint being read") {
  Tmp t;
  const std::string root = t / "ckpt";
  fs::create_directories(root + "/step_20");
  spit(root + "/step_20/index.json", "{}");
  spit(root + "/latest", "step_20\n");
  namespace ck = dtrain::checkpoint;
  for (const std::string& given : {root, root + "/step_20", root + "/latest"})
    for (const std::string& out : {root + "/latest", root + "/step_20/index.json",
                                   root + "/merged.safetensors", root + "/step_20/../x"}) {
      CAPTURE(given);
      CAPTURE(out);
      CHECK(has(config_error([&] { ck::check_outside(out, "OUT", given, root + "/step_20"); }),
                "inside the checkpoint being read"));
    }
  CHECK(config_error([&] { ck::check_outside(t / "merged.safetensors", "OUT", root, root + "/step_20"); }) == "");
  // A link into the checkpoint's directory is caught by its real location.
  fs::create_directory_symlink(root, t / "alias");
  CHECK(has(config_error([&] { ck::check_outside(t / "alias/latest", "OUT", root, root + "/step_20"); }),
            "inside the checkpoint"));
}

TEST_CASE("checkpoint dir: move_aside keeps the steps, set_latest points at one") {
  Tmp t;
  namespace ck = dtrain::checkpoint;
  for (int s : {10, 20}) fs::create_directories(t / ("step_" + std::to_string(s)));
  ck::set_latest(t.path(), 20);
  CHECK(read_file(t / "latest") == "step_20\n");
  const std::string aside = ck::move_aside(t.path(), {"step_20", "latest"});
  CHECK(fs::path(aside).filename().string().rfind("previous_", 0) == 0);
  CHECK(fs::is_directory(aside + "/step_20"));
  CHECK(fs::exists(aside + "/latest"));
  CHECK(ck::list_steps(t.path()) == std::vector<int64_t>{10});  // previous_* is not a step
  const std::string again = ck::move_aside(t.path(), {"step_10"});
  CHECK(again != aside);  // two moves in one second get two directories
}

TEST_CASE("job spec file: a directory, an empty file or only comments is refused") {
  Tmp t;
  CHECK(has(config_error([&] { dtrain::load_job_spec(t.path()); }), "is a directory"));
  spit(t / "empty.yaml", "");
  CHECK(has(config_error([&] { dtrain::load_job_spec(t / "empty.yaml"); }), "is empty"));
  spit(t / "comments.yaml", "# nothing here\n\n");
  CHECK(has(config_error([&] { dtrain::load_job_spec(t / "comments.yaml"); }), "holds no YAML"));
  CHECK(has(config_error([&] { dtrain::load_job_spec("/dev/null"); }), "is a device"));
  spit(t / "ok.yaml", "job: {name: fine}\n");
  CHECK(dtrain::load_job_spec(t / "ok.yaml").job.name == "fine");
}

TEST_CASE("job spec sizes: products are checked against stated maxima, not overflowed") {
  std::string e = config_error([] { dtrain::parse_job_spec("", "s.yaml", {"train.micro_batch=1000000000"}); });
  CHECK(has(e, "train.micro_batch(1000000000) * train.grad_accum(1) * parallel.dp(1) = 1000000000"));
  CHECK(has(e, "maximum 16777216"));
  CHECK_FALSE(has(e, "-294967296"));
  // The parameter count's maximum is the cost model's (plan/), checked before any worker starts.
  e = config_error([] {
    dtrain::plan::check_combinations(dtrain::parse_job_spec("", "s.yaml", {"model.d_model=1000000", "model.heads=1"}));
  });
  CHECK(has(e, "model.d_model = 1000000"));
  CHECK(has(e, "more than the maximum 1e12"));
  // Within the maxima: no error, and the parameter count follows the GPT.
  dtrain::JobSpec s = dtrain::parse_job_spec("", "s.yaml", {"model.d_model=64", "model.layers=2"});
  const double d = 64, v = 256, T = 64;
  CHECK(dtrain::plan::model_size(s).params == doctest::Approx(2 * v * d + T * d + 2 * (12 * d * d + 13 * d) + 2 * d));
}

TEST_CASE("memory check: training state larger than this machine is refused unless allowed") {
  dtrain::JobSpec s = dtrain::parse_job_spec("", "big.yaml", {"model.d_model=16384", "model.heads=1", "model.layers=64"});
  REQUIRE(dtrain::machine_memory_bytes() > 0);
  std::string e = config_error([&] { dtrain::plan::check_fits_memory(s, false); });
  CHECK(has(e, "model.d_model = 16384"));
  CHECK(has(e, "--allow-large"));
  CHECK(config_error([&] { dtrain::plan::check_fits_memory(s, true); }) == "");
  dtrain::JobSpec small = dtrain::parse_job_spec("", "small.yaml");
  CHECK(config_error([&] { dtrain::plan::check_fits_memory(small, false); }) == "");
}
