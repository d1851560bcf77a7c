// log.tensorboard through the real `dtrain launch`: TensorBoard's own reader
// (EventAccumulator, tests/support/tb_check.py) reads every metrics.jsonl
// scalar at its step from the event files, across a worker restart (two
// files, the redone steps superseded), and the resolved spec as text; a copy
// with one corrupted CRC must fail the same check (the reader verifies the
// framing); a run from scratch moves the earlier event files aside, and
// log.tensorboard false writes none.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using parity::launch_raw;
using parity::Parity;
namespace fs = std::filesystem;

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::pair<int, std::string> tb_check(const std::string& metrics, const std::string& events_dir,
                                     const std::string& spec, const std::string& log) {
  return run_command({python(), source_dir() + "/tests/support/tb_check.py", metrics, events_dir, "--spec", spec}, log,
                     120);
}

}  // namespace

TEST_CASE("log.tensorboard: EventAccumulator reads every metrics.jsonl scalar at its step, across a restart") {
  REQUIRE_MESSAGE(!python().empty(), "no Python was found at configure time: run scripts/install-deps");
  // 20 steps logged every step; rank 0 is killed after step 12 and the restart
  // resumes from the checkpoint at step 10, so steps 11 and 12 are logged twice.
  auto [code, out] = launch_raw("tb", {"checkpoint.every=10", "cluster.max_restarts=1", "fault.kind=kill_after_step",
                                       "fault.step=12"});
  INFO(out);
  REQUIRE(code == 0);
  auto& p = Parity::get();
  const std::string run = p.dir / "tb";
  const auto files = event_files(run + "/tb");
  REQUIRE(files.size() == 2);  // one per worker start
  auto [pcode, pout] = tb_check(run + "/metrics.jsonl", run + "/tb", run + "/spec.resolved.yaml", p.dir / "tb_check.log");
  MESSAGE(pout);
  CHECK(pcode == 0);
  CHECK(pout.find("at 20 steps") != std::string::npos);

  // Negative control: the same files with one bit of the data CRC of the
  // 10th record of the first file flipped. The reader stops at a record
  // whose CRC fails, so steps go missing and the check must fail.
  const std::string bad = p.dir / "tb_corrupt";
  fs::create_directories(bad);
  for (const auto& f : files) fs::copy_file(f, bad + "/" + fs::path(f).filename().string());
  std::string bytes = read_file(files[0]);
  size_t at = 0;
  for (int record = 0; record < 10; ++record) {
    uint64_t length = 0;
    REQUIRE(at + 12 <= bytes.size());
    std::memcpy(&length, bytes.data() + at, 8);
    at += 8 + 4 + length + 4;
  }
  bytes[at - 1] = char(bytes[at - 1] ^ 1);
  write_file(bad + "/" + fs::path(files[0]).filename().string(), bytes);
  auto [ccode, cout] = tb_check(run + "/metrics.jsonl", bad, run + "/spec.resolved.yaml", p.dir / "tb_corrupt.log");
  MESSAGE("negative control (one CRC bit flipped):\n" << cout);
  CHECK(ccode == 1);
  CHECK(cout.find("MISMATCH scalar") != std::string::npos);
}

TEST_CASE("log.tensorboard: a run from scratch moves earlier event files to tb.before_<time>; false writes none") {
  const std::vector<std::string> sets = {"train.steps=2", "checkpoint.dir=\"\""};
  auto [code, out] = launch_raw("again", sets);
  INFO(out);
  REQUIRE(code == 0);
  const std::string run = Parity::get().dir / "again";
  REQUIRE(event_files(run + "/tb").size() == 1);
  auto [code2, out2] = launch_raw("again", parity::with(sets, {"log.tensorboard=false"}));
  INFO(out2);
  REQUIRE(code2 == 0);
  CHECK(fs::exists(run + "/metrics.jsonl"));
  CHECK(!fs::exists(run + "/tb"));  // log.tensorboard false: no event files
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind("tb.before_", 0) == 0) kept.push_back(e.path().string());
  REQUIRE(kept.size() == 1);
  CHECK(event_files(kept[0]).size() == 1);
  CHECK(out2.find("the earlier tb is now " + kept[0]) != std::string::npos);
}

TEST_CASE("the venv's tensorboard command starts (the README's way to view log.dir/tb)") {
  REQUIRE_MESSAGE(!python().empty(), "no Python was found at configure time: run scripts/install-deps");
  // tensorboard's entry point imports pkg_resources, which setuptools >= 81
  // no longer ships; install-deps keeps a setuptools that has it.
  const std::string tb = (fs::path(python()).parent_path() / "tensorboard").string();
  REQUIRE_MESSAGE(fs::exists(tb), "missing (run scripts/install-deps): " << tb);
  auto& p = Parity::get();
  auto [code, out] = run_command({tb, "--version"}, p.dir / "tb_version.log", 120);
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("2.") != std::string::npos);
}
