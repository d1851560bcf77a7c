// Unit tests of engine/trainer's MetricsLogger: metrics.jsonl stays JSON
// that any reader accepts when a value is NaN or inf (null, and
// "nonfinite": true on that step), and a non-finite step is written even
// between log.every steps; so is a step data.valid evaluated, with its val_loss;
// and mfu.h's peak_spread, the start-up line on the ranks' matmul rates.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/trainer/metrics.h"
#include "engine/trainer/mfu.h"

namespace fs = std::filesystem;
using dtrain::engine::trainer::MemoryStats;
using dtrain::engine::trainer::MetricsLogger;
using dtrain::engine::trainer::MetricsOptions;
using dtrain::engine::trainer::StepReport;

TEST_CASE("metrics.jsonl: NaN and inf become null, the step says nonfinite, every line parses") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_metrics_test_" + std::to_string(::getpid()));
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  {
    MetricsOptions o;
    o.total_steps = 10;
    o.every = 5;
    o.tokens_per_step = 64;
    o.jsonl_path = (dir / "metrics.jsonl").string();
    MetricsLogger m(o);
    StepReport r;
    r.lr = 1e-3;
    r.step_s = 0.01;
    for (int64_t step = 1; step <= 5; ++step) {
      r.step = step;
      r.loss = step == 3 ? nan : 2.5;
      r.grad_norm = step == 3 ? inf : 1.0;
      r.nonfinite = step == 3;  // logged although 3 is no multiple of log.every
      r.extra = {{"moe_max_load", step == 3 ? nan : 1.5}};
      m.record(r, MemoryStats{}, /*print=*/true);
    }
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    INFO(line);
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    REQUIRE_FALSE(j.is_discarded());
    lines.push_back(j);
  }
  fs::remove_all(dir);
  REQUIRE(lines.size() == 3);  // steps 1, 3, 5
  CHECK(lines[1]["step"] == 3);
  CHECK(lines[1]["loss"].is_null());
  CHECK(lines[1]["grad_norm"].is_null());
  CHECK(lines[1]["moe_max_load"].is_null());
  CHECK(lines[1]["nonfinite"] == true);
  CHECK(lines[2]["loss"] == 2.5);
  CHECK_FALSE(lines[2].contains("nonfinite"));
}

TEST_CASE("metrics.jsonl: an evaluated step is written between log.every steps with val_loss, val_ppl, eval_ms "
          "and val_loss_by_source") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_metrics_val_test_" + std::to_string(::getpid()));
  {
    MetricsOptions o;
    o.total_steps = 10;
    o.every = 5;
    o.tokens_per_step = 64;
    o.jsonl_path = (dir / "metrics.jsonl").string();
    MetricsLogger m(o);
    StepReport r;
    r.step_s = 0.01;
    for (int64_t step = 1; step <= 5; ++step) {
      r.step = step;
      r.loss = 2.5;
      r.evaluated = step == 4;  // data.valid.every 4: not a logging step
      r.val_loss = step == 4 ? 1.2345678901234567 : 0;
      r.val_ppl = std::exp(r.val_loss);
      r.eval_ms = 12.5;
      // data.valid.blend's per-file losses, with a name that needs escaping.
      r.val_loss_by_source = {{"va.txt", 1.0000000000000002}, {"v\"b", 2.5}};
      m.record(r, MemoryStats{}, /*print=*/true);
    }
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  fs::remove_all(dir);
  REQUIRE(lines.size() == 3);  // steps 1, 4, 5
  CHECK(lines[1]["step"] == 4);
  CHECK(lines[1]["val_loss"].get<double>() == 1.2345678901234567);  // all 17 digits
  CHECK(lines[1]["val_ppl"].get<double>() == doctest::Approx(std::exp(1.2345678901234567)));
  CHECK(lines[1]["eval_ms"] == 12.5);
  CHECK(lines[1]["val_loss_by_source"]["va.txt"].get<double>() == 1.0000000000000002);  // all 17 digits
  CHECK(lines[1]["val_loss_by_source"]["v\"b"].get<double>() == 2.5);
  CHECK(lines[1]["val_loss_by_source"].size() == 2);
  CHECK_FALSE(lines[0].contains("val_loss_by_source"));  // only with an evaluation
  CHECK_FALSE(lines[0].contains("val_loss"));
  CHECK_FALSE(lines[2].contains("val_loss"));
}

TEST_CASE("peak_spread: the ranks' matmul rates, their median, the slowest rank, and when it is slow") {
  using dtrain::engine::trainer::peak_spread;
  // Rates as two cores of a shared VM gave them (bench/results/mfu_ceiling_s64.txt).
  auto s = peak_spread({101.9, 129.8});
  CHECK(s.min == 101.9);
  CHECK(s.max == 129.8);
  CHECK(s.median == doctest::Approx(115.85));
  CHECK(s.slowest_rank == 0);
  CHECK_FALSE(s.slow);  // 101.9 is 88% of 115.85: within 85%
  s = peak_spread({152.6, 98.0, 150.1, 149.9});
  CHECK(s.slowest_rank == 1);
  CHECK(s.median == doctest::Approx(150.0));
  CHECK(s.slow);  // 98 is 65% of the median
  CHECK_FALSE(peak_spread({98.0, 152.6}, 0.6).slow);  // a looser threshold
  s = peak_spread({140.0});
  CHECK(s.slowest_rank == 0);
  CHECK_FALSE(s.slow);  // one rank has no one to be slower than
  CHECK(peak_spread({}).slowest_rank == -1);
}
