// `dtrain bench comm` end to end: the real dtrain launching 2 dtrain-worker
// ranks per collective over a few sizes. Checks the table (one verified row
// per size, positive bandwidths), the exit codes, refusals of bad input, and
// the reduce-scatter path chosen by --reduce-scatter (cluster.gloo_reduce_scatter).
// Speeds are printed, never asserted (a loaded CI machine is slow).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"

namespace {

using dtrain::testing::TempDir;

const std::vector<std::string> kOps = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                       "broadcast"};

// One row of rank 0's table: "[rank 0]  size count type time algbw busbw check".
struct Row {
  long long bytes = 0, count = 0;
  std::string dtype, check;
  double time_us = 0, algbw = 0, busbw = 0;
};

std::vector<Row> table_rows(const std::string& output) {
  std::vector<Row> rows;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    auto at = line.find("[rank 0]");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 8));
    Row r;
    if (fields >> r.bytes >> r.count >> r.dtype >> r.time_us >> r.algbw >> r.busbw >> r.check)
      rows.push_back(r);
  }
  return rows;
}

// `dtrain bench comm ARGS`, its temporary files inside `dir`.
std::pair<int, std::string> bench(const TempDir& dir, const std::string& name,
                                  std::vector<std::string> args,
                                  std::vector<std::string> env = {}) {
  dtrain::testing::TagGuard tag;
  args.insert(args.begin(), {dtrain::testing::dtrain_bin(), "bench", "comm"});
  env.push_back(tag.env());
  env.push_back("TMPDIR=" + (dir / "tmp"));
  return dtrain::testing::run_command(args, dir / (name + ".log"), 120, env);
}

}  // namespace

TEST_CASE("bench comm: every op at 2 ranks, one checked row per size, positive bus bandwidth") {
  TempDir dir;
  std::filesystem::create_directories(dir / "tmp");
  const std::vector<long long> sizes = {64 << 10, 128 << 10, 256 << 10, 512 << 10};
  for (const auto& op : kOps) {
    CAPTURE(op);
    auto [code, out] = bench(dir, op, {"--op", op, "-n", "2", "--min", "64K", "--max", "512K", "--iters", "2"});
    INFO(out);
    CHECK(code == 0);
    // The header names the group's path: one node, so shared memory.
    CHECK(out.find(op + ", 2 ranks (gloo, path shm)") != std::string::npos);
    if (op == "reduce_scatter") CHECK(out.find("reduce_scatter path: ring") != std::string::npos);
    auto rows = table_rows(out);
    REQUIRE(rows.size() == sizes.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      CAPTURE(i);
      CHECK(rows[i].bytes == sizes[i]);
      CHECK(rows[i].count == sizes[i] / 4);
      CHECK(rows[i].dtype == "fp32");
      CHECK(rows[i].check == "ok");
      CHECK(rows[i].time_us > 0);
      CHECK(rows[i].algbw > 0);
      CHECK(rows[i].busbw > 0);
    }
    MESSAGE(op << " at 2 ranks: busbw " << rows.front().busbw << " GB/s at " << rows.front().bytes
               << " B, " << rows.back().busbw << " GB/s at " << rows.back().bytes << " B");
  }
  // The per-run log directory goes away with a successful run.
  CHECK(std::filesystem::is_empty(dir / "tmp"));
}

TEST_CASE("bench comm: --reduce-scatter native runs Gloo's own; a bad value is refused") {
  // The ring (the default) runs in the case above.
  TempDir dir;
  std::filesystem::create_directories(dir / "tmp");
  std::vector<std::string> args = {"--op", "reduce_scatter", "-n", "2", "--min", "64K",
                                   "--max", "128K", "--iters", "1", "--reduce-scatter"};
  {
    args.push_back("native");
    auto [code, out] = bench(dir, "native", args);
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("reduce_scatter path: native") != std::string::npos);
    auto rows = table_rows(out);
    REQUIRE(rows.size() == 2);
    for (const auto& row : rows) CHECK(row.check == "ok");
  }
  args.back() = "tree";
  auto [code, out] = bench(dir, "bad", args);
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("--reduce-scatter tree: not a reduce-scatter path") != std::string::npos);
  CHECK(out.find("[rank") == std::string::npos);  // refused before any worker started
}

TEST_CASE("bench comm: -n 0 and an unknown op exit 2 and say what is wrong") {
  TempDir dir;
  std::filesystem::create_directories(dir / "tmp");
  {
    auto [code, out] = bench(dir, "n0", {"--op", "all_reduce", "-n", "0"});
    INFO(out);
    CHECK(code == 2);
    CHECK(out.find("-n 0") != std::string::npos);
  }
  {
    auto [code, out] = bench(dir, "unknown", {"--op", "all_sum", "-n", "2"});
    INFO(out);
    CHECK(code == 2);
    CHECK(out.find("all_sum") != std::string::npos);
    CHECK(out.find("[rank") == std::string::npos);  // refused before any worker started
  }
}
