// Goodput's accounting (launcher/goodput.h) on made-up attempts: steps at or
// below the high-water mark are redone, the lead-in is start-up on a launch's
// first attempt and restart after it, idle takes the rest; and goodput.json
// keeps an earlier launch's segment and adds one per launch; the figures
// come from rank 0's trace file and metrics.jsonl's eval_ms.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "launcher/goodput.h"
#include "tests/support/child.h"

using namespace dtrain::launcher;

namespace {

// An attempt spawned at t = 100 s whose first step began at 102 s and that
// ran steps start+1..done in 10 s, with 1 s of checkpoint saves.
GoodputAttempt attempt(bool first, int64_t start, int64_t done) {
  GoodputAttempt a;
  a.spawned = 100;
  a.first = first;
  a.has_trace = true;
  a.rank0.first_step_ns = 102'000'000'000;
  a.rank0.start_step = start;
  a.rank0.done_step = done;
  a.rank0.step_ns = 10'000'000'000;
  a.rank0.checkpoint_ns = 1'000'000'000;
  a.eval_s = 0.5;
  return a;
}

}  // namespace

TEST_CASE("goodput: redone steps are those at or below the high-water mark, split by count") {
  // Resumed at 10 after reaching 14 before: steps 11..14 of 11..20 are redone.
  GoodputSeconds s = account_attempt(attempt(false, 10, 20), 115, 14);
  CHECK(s.redone == doctest::Approx(4.0));
  CHECK(s.productive == doctest::Approx(6.0));
  CHECK(s.restart == doctest::Approx(2.0));  // not the first attempt: its lead-in is restart
  CHECK(s.startup == 0);
  CHECK(s.checkpoint == doctest::Approx(1.0));
  CHECK(s.eval == doctest::Approx(0.5));
  CHECK(s.idle == doctest::Approx(15 - 2 - 10 - 1 - 0.5));
  CHECK(s.sum() == doctest::Approx(15.0));
  // A first attempt: nothing redone, the lead-in is start-up.
  GoodputSeconds f = account_attempt(attempt(true, 0, 10), 115, 0);
  CHECK(f.redone == 0);
  CHECK(f.productive == doctest::Approx(10.0));
  CHECK(f.startup == doctest::Approx(2.0));
  // No step began (no trace): all of it was getting there.
  GoodputAttempt none = attempt(false, 0, 0);
  none.has_trace = false;
  GoodputSeconds n = account_attempt(none, 103, 5);
  CHECK(n.restart == doctest::Approx(3.0));
  CHECK(n.sum() == doctest::Approx(3.0));
}

TEST_CASE("goodput.json: a later launch adds a segment and keeps the earlier one") {
  dtrain::testing::TempDir dir;
  {
    Goodput g(dir.path(), 1000);
    g.started(1001);
    g.ended(1004);
    g.finish(1005);
  }
  auto first = nlohmann::json::parse(dtrain::testing::read_file(dir.path() + "/goodput.json"));
  CHECK(first["segments"].size() == 1);
  CHECK(first["wall_s"].get<double>() == doctest::Approx(5.0));
  CHECK(first["seconds"]["startup"].get<double>() == doctest::Approx(4.0));  // no step ever began
  CHECK(first["seconds"]["idle"].get<double>() == doctest::Approx(1.0));
  {
    Goodput g(dir.path(), 2000);
    g.started(2002);
    g.finish(2010);
  }
  auto second = nlohmann::json::parse(dtrain::testing::read_file(dir.path() + "/goodput.json"));
  REQUIRE(second["segments"].size() == 2);
  CHECK(second["segments"][0]["seconds"] == first["segments"][0]["seconds"]);
  CHECK(second["wall_s"].get<double>() == doctest::Approx(15.0));
  CHECK(second["seconds"]["startup"].get<double>() == doctest::Approx(14.0));
}

TEST_CASE("goodput: rank 0's trace file and metrics.jsonl's eval_ms, read as the agent reads them") {
  dtrain::testing::TempDir dir;
  dtrain::testing::write_file(dir / "metrics.jsonl", "{\"step\": 1, \"eval_ms\": 9000}\n");  // before: not this attempt's
  Goodput g(dir.path(), 1000);
  g.started(1000);
  // Rank 0 began its first step at 1001 s and ran steps 1..8 in 4 s, 0.5 s of saves.
  auto f = std::make_unique<dtrain::trace::FileLayout>();
  std::memset(f.get(), 0, sizeof *f);
  std::memcpy(f->magic, dtrain::trace::kMagic, sizeof f->magic);
  f->first_step_ns = 1'001'000'000'000;
  f->done_step = 8;
  f->step_ns = 4'000'000'000;
  f->checkpoint_ns = 500'000'000;
  const double none = std::nan("");
  std::memcpy(&f->loss_bits, &none, sizeof none);
  std::filesystem::create_directories(dir / "collectives");
  dtrain::testing::write_file(dtrain::trace::trace_path(dir.path(), 0),
                              std::string(reinterpret_cast<const char*>(f.get()), sizeof *f));
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 4, \"eval_ms\": 250}\n{\"step\": 8, \"eval_ms\": 750}\n";
  g.ended(1010);
  const GoodputSeconds s = g.totals(1010);
  CHECK(s.startup == doctest::Approx(1.0));
  CHECK(s.productive == doctest::Approx(4.0));
  CHECK(s.checkpoint == doctest::Approx(0.5));
  CHECK(s.eval == doctest::Approx(1.0));  // 250 + 750 ms; the 9 s line was there before
  CHECK(s.idle == doctest::Approx(3.5));
  CHECK(s.sum() == doctest::Approx(10.0));
}
