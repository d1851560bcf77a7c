// The test harness itself: skips are counted and listed (tests/support/skip.h
// with doctest_main.cpp: exit 77 when every case skipped, the list at the
// end and in $DTRAIN_SKIP_LOG, a failure under CI=true for a kind CI
// machines must meet; run_without_leftovers.cmake's line for ctest), and
// cached runs are keyed by spec and overrides (tests/support/run_cache.h).
// Runs this program again on its fixture case; no training runs.
#include <doctest/doctest.h>

#include <unistd.h>

#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/run_cache.h"
#include "tests/support/skip.h"

using dtrain::testing::RunCache;
using dtrain::testing::SkipKind;
using dtrain::testing::TempDir;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string self() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, size_t(n));
}

constexpr const char* kFixture = "harness fixture: a case that skips for want of $DTRAIN_FIXTURE_SKIP";

// This program's fixture case alone, with `env`: {exit code, output}.
std::pair<int, std::string> run_fixture(const TempDir& dir, const std::vector<std::string>& env) {
  return dtrain::testing::run_command({self(), "--no-skip", std::string("--test-case=") + kFixture},
                                      dir / "fixture.log", 60, env);
}

}  // namespace

// Run only by the cases below (doctest::skip keeps it out of a plain run).
TEST_CASE(kFixture * doctest::skip()) {
  const std::string kind = std::getenv("DTRAIN_FIXTURE_SKIP") ? std::getenv("DTRAIN_FIXTURE_SKIP") : "";
  if (kind == "test_hosts") DTRAIN_SKIP(test_hosts, "fixture: no test hosts");
  if (kind == "gpu") DTRAIN_SKIP(gpu, "fixture: no GPU");
  CHECK(kind == "none");
}

TEST_CASE("skips: a program whose every case skipped exits 77 and lists the case, kind and reason") {
  TempDir dir;
  const std::string log = dir / "skips.tsv";
  auto [code, out] = run_fixture(dir, {"CI=false", "DTRAIN_FIXTURE_SKIP=test_hosts", "DTRAIN_SKIP_LOG=" + log});
  INFO(out);
  CHECK(code == dtrain::testing::kSkipExitCode);
  CHECK(has(out, "1 of 1 cases skipped:"));
  CHECK(has(out, std::string("SKIPPED ") + kFixture + " (test_hosts): fixture: no test hosts"));
  const std::string logged = dtrain::testing::read_file(log);
  CHECK(has(logged, std::string("\t") + kFixture + "\ttest_hosts\tfixture: no test hosts\n"));

  // The same case not skipping: exit 0, no list, nothing logged.
  auto [code2, out2] = run_fixture(dir, {"CI=false", "DTRAIN_FIXTURE_SKIP=none", "DTRAIN_SKIP_LOG=" + log});
  INFO(out2);
  CHECK(code2 == 0);
  CHECK_FALSE(has(out2, "SKIPPED"));
  CHECK_FALSE(has(out2, "cases skipped"));
  CHECK(dtrain::testing::read_file(log) == logged);
}

TEST_CASE("skips: under CI=true a skip CI machines must not meet fails; a GPU skip stays a skip") {
  TempDir dir;
  auto [code, out] = run_fixture(dir, {"CI=true", "DTRAIN_FIXTURE_SKIP=test_hosts", "DTRAIN_SKIP_LOG="});
  INFO(out);
  CHECK(code == 1);
  CHECK(has(out, "CI=true and this case would skip for want of root with network namespaces"));
  auto [gpu_code, gpu_out] = run_fixture(dir, {"CI=true", "DTRAIN_FIXTURE_SKIP=gpu", "DTRAIN_SKIP_LOG="});
  INFO(gpu_out);
  CHECK(gpu_code == dtrain::testing::kSkipExitCode);
  for (SkipKind k : {SkipKind::test_hosts, SkipKind::slurm, SkipKind::dev_shm})
    CHECK(!dtrain::testing::skip_failure(k, "r", /*ci=*/true).empty());
  for (SkipKind k : {SkipKind::gpu, SkipKind::cuda_libtorch, SkipKind::blas, SkipKind::cpu})
    CHECK(dtrain::testing::skip_failure(k, "r", /*ci=*/true).empty());
  CHECK(dtrain::testing::skip_failure(SkipKind::test_hosts, "r", /*ci=*/false).empty());
}

TEST_CASE("skips: run_without_leftovers.cmake turns exit 77 into the line ctest reads as Skipped") {
  TempDir dir;
  dtrain::testing::write_file(dir / "exit77.sh", "#!/bin/sh\nexit 77\n");
  dtrain::testing::write_file(dir / "exit1.sh", "#!/bin/sh\nexit 1\n");
  ::chmod((dir / "exit77.sh").c_str(), 0755);
  ::chmod((dir / "exit1.sh").c_str(), 0755);
  const auto wrap = [&](const std::string& prog) {
    return dtrain::testing::run_command(
        {DTRAIN_CMAKE_COMMAND, "-DTEST=" + (dir / prog), "-DBUILD_DIR=" + (dir / "none"),
         "-DWORK_DIR=" + (dir / "none"), "-P",
         dtrain::testing::source_dir() + "/tests/cmake/run_without_leftovers.cmake"},
        dir / (prog + ".log"), 60);
  };
  auto [code, out] = wrap("exit77.sh");
  INFO(out);
  CHECK(code == 0);
  CHECK(has(out, "dtrain-test: every case of " + (dir / "exit77.sh") + " skipped (exit 77)"));
  auto [code1, out1] = wrap("exit1.sh");
  INFO(out1);
  CHECK(code1 != 0);
  CHECK_FALSE(has(out1, "skipped (exit 77)"));
}

TEST_CASE("run cache: another override list or spec under a run's name is refused, never the stale run") {
  RunCache<int> cache;
  int launches = 0;
  const auto launch = [&] { return ++launches; };
  const std::vector<std::string> sets = {"parallel.dp=2", "train.lr=1e-3"};
  CHECK(cache.get("run", "spec", sets, launch) == 1);
  CHECK(cache.get("run", "spec", sets, launch) == 1);  // cached: same name, spec, overrides
  CHECK(launches == 1);
  CHECK(cache.get("other", "spec", {"parallel.dp=2", "train.lr=2e-3"}, launch) == 2);
  // A changed --set, a reordered list (the later --set wins), a changed spec:
  // each is another run, so each key differs.
  const std::string k = RunCache<int>::key("spec", sets);
  CHECK(RunCache<int>::key("spec", {"parallel.dp=2", "train.lr=2e-3"}) != k);
  CHECK(RunCache<int>::key("spec", {"train.lr=1e-3", "parallel.dp=2"}) != k);
  CHECK(RunCache<int>::key("spec2", sets) != k);
  CHECK(RunCache<int>::key("spec", {"parallel.dp=2\n21:train.lr=1e-3"}) != k);  // no joining alike
  CHECK(RunCache<int>::key("spec", {"parallel.dp=2", "train.lr=1e-3"}) == k);
  CHECK_THROWS_WITH(cache.get("run", "spec", {"parallel.dp=2", "train.lr=2e-3"}, launch),
                    doctest::Contains("run 'run' asked for again with other inputs"));
  CHECK_THROWS(cache.get("run", "spec2", sets, launch));
  CHECK(launches == 2);
}
