// The timeline trace without workers: the recorder keeps exactly the spans
// of its step range and writes them once; rank files read back unchanged;
// the merge aligns clocks, names processes, keeps every track's slices
// nested (extra lanes for overlapping ones) and refuses incomplete input;
// log.trace.steps' rules (exit 2 naming the field, a warning past 50 steps).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "common/timeline.h"
#include "tests/support/spec_errors.h"

namespace {

namespace tl = dtrain::timeline;
namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  Dir() {
    char tmpl[] = "/tmp/dtrain-timeline-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~Dir() { fs::remove_all(path); }
};

tl::Span span(tl::Kind kind, int64_t begin, int64_t end, int step, int micro = -1) {
  tl::Span s;
  s.kind = kind;
  s.begin_ns = begin;
  s.end_ns = end;
  s.step = step;
  s.micro = int16_t(micro);
  return s;
}

void write_rank(const fs::path& log_dir, int rank, int world, int64_t offset, std::vector<tl::Span> spans) {
  tl::RankFile f;
  f.info.rank = rank;
  f.info.world = world;
  f.info.coords = "tp0 pp" + std::to_string(rank) + " dp0";
  f.info.pp_stage = rank;
  f.info.offset_ns = offset;
  f.from = 1;
  f.to = 1;
  f.spans = std::move(spans);
  fs::create_directories(log_dir / "trace");
  tl::write_rank_file(tl::rank_file_path((log_dir / "trace").string(), rank), f);
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("timeline: only the range's steps are recorded, and written once after its last step") {
  Dir dir;
  tl::Options o;
  o.from = 2;
  o.to = 3;
  o.dir = (dir.path / "trace").string();
  o.info.rank = 1;
  o.info.world = 2;
  tl::start(o);
  tl::set_offset(-1234, 50);
  for (int step = 1; step <= 4; ++step) {
    tl::begin_step(step);
    { tl::Scope s(tl::Kind::forward, 0); }
    tl::record_collective("all_reduce", "dp", 4096, tl::now_ns(), 17);
    const std::string path = tl::end_step();
    CHECK(path == (step == 3 ? tl::rank_file_path(o.dir, 1) : ""));
  }
  CHECK_FALSE(tl::recording());
  tl::stop();
  const tl::RankFile f = tl::read_rank_file(tl::rank_file_path(o.dir, 1));
  CHECK(f.info.offset_ns == -1234);
  CHECK(f.info.rtt_ns == 50);
  REQUIRE(f.spans.size() == 6);  // steps 2 and 3: forward, collective, step
  for (const auto& s : f.spans) {
    CHECK((s.step == 2 || s.step == 3));
    CHECK(s.begin_ns <= s.end_ns);
  }
  CHECK(std::string(f.spans[1].op) == "all_reduce");
  CHECK(std::string(f.spans[1].group) == "dp");
  CHECK(f.spans[1].bytes == 4096);
  CHECK(f.spans[1].wait_ns == 17);
  CHECK(f.spans[2].kind == tl::Kind::step);
}

TEST_CASE("timeline merge: pid per rank, clocks aligned to rank 0, nested tracks") {
  Dir dir;
  // Rank 1's clock runs 5000 ns ahead: its spans land 5 us earlier.
  write_rank(dir.path, 0, 2, 0,
             {span(tl::Kind::step, 1000, 100000, 1), span(tl::Kind::forward, 2000, 30000, 1, 0),
              span(tl::Kind::collective, 10000, 50000, 1), span(tl::Kind::collective, 20000, 60000, 1),
              span(tl::Kind::collective, 400, 1500, 1)});  // launched 600 ns before its step
  write_rank(dir.path, 1, 2, 5000, {span(tl::Kind::step, 6000, 105000, 1), span(tl::Kind::backward, 7000, 9000, 1, 3)});
  tl::MergeStats st;
  const auto j = nlohmann::json::parse(tl::merge_to_chrome(dir.path.string(), &st));
  CHECK(st.ranks == 2);
  CHECK(st.spans == 7);
  int early = 0;
  std::map<int, std::string> names;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> slices;  // (pid, tid) -> [ts, end]
  double step1_ts = -1, step0_ts = -1;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    slices[{e["pid"], e["tid"]}].push_back({e["ts"], double(e["ts"]) + double(e["dur"])});
    if (e["name"] == "step 1") (e["pid"] == 0 ? step0_ts : step1_ts) = e["ts"];
    if (e["name"] == "B3") CHECK(e["args"]["stage"] == 1);
    if (e["args"].contains("launched_before_step_us")) {
      ++early;
      CHECK(e["ts"] == doctest::Approx(0.0));  // drawn from its step's begin
      CHECK(e["args"]["launched_before_step_us"] == doctest::Approx(0.6));
    }
  }
  CHECK(names[0] == "rank 0 (tp0 pp0 dp0)");
  CHECK(names[1] == "rank 1 (tp0 pp1 dp0)");
  CHECK(step0_ts == doctest::Approx(0.0));
  CHECK(step1_ts == doctest::Approx(0.0));  // 6000 - 5000 = rank 0's 1000
  // The two collectives overlap without nesting: two lanes, each nested.
  int collective_lanes = 0;
  for (auto& [key, v] : slices) {
    collective_lanes += key.second / 10 == 3;
    std::sort(v.begin(), v.end());
    std::vector<double> open;
    for (auto [b, e] : v) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      CHECK((open.empty() || e <= open.back()));
      open.push_back(e);
    }
  }
  CHECK(collective_lanes == 2);
  CHECK(early == 1);
}

TEST_CASE("timeline merge: a directory without a complete trace is refused") {
  Dir dir;
  CHECK(error_of([&] { tl::merge_to_chrome(dir.path.string(), nullptr); }).find("holds no timeline trace") !=
        std::string::npos);
  fs::create_directories(dir.path / "trace");
  CHECK(error_of([&] { tl::merge_to_chrome(dir.path.string(), nullptr); }).find("holds no rank_<r>.json") !=
        std::string::npos);
  write_rank(dir.path, 0, 3, 0, {span(tl::Kind::step, 1, 2, 1)});
  write_rank(dir.path, 2, 3, 0, {span(tl::Kind::step, 1, 2, 1)});
  CHECK(error_of([&] { tl::merge_to_chrome(dir.path.string(), nullptr); }).find("lacks the files of rank(s) 1 of 3") !=
        std::string::npos);
  std::ofstream(dir.path / "trace" / "rank_1.json") << "{\"format\": \"dtrain-timeline-1\"";  // cut short
  CHECK(error_of([&] { tl::merge_to_chrome(dir.path.string(), nullptr); }).find("rank_1.json is not a valid") !=
        std::string::npos);
}

TEST_CASE("spec: log.trace.steps is a range inside [1, train.steps]") {
  using dtrain::testing::config_error_of;
  const std::string base = "train: {steps: 10}\n";
  CHECK(config_error_of(base, "t.yaml", {"log.trace.steps=[2, 3]"}) == "");
  CHECK(config_error_of(base, "t.yaml", {"log.trace.steps=[4, 3]"})
            .find("log.trace.steps = [4, 3]: FROM is after TO") != std::string::npos);
  CHECK(config_error_of(base, "t.yaml", {"log.trace.steps=[9, 11]"})
            .find("log.trace.steps = [9, 11]: steps count from 1 to train.steps = 10") != std::string::npos);
  CHECK(config_error_of(base, "t.yaml", {"log.trace.steps=[0, 1]"}).find("log.trace.steps = [0, 1]") !=
        std::string::npos);
  CHECK(config_error_of(base, "t.yaml", {"log.trace.steps=[3]"}).find("give two steps [FROM, TO]") !=
        std::string::npos);
  std::vector<std::string> warnings;
  dtrain::parse_job_spec("train: {steps: 100}\n", "t.yaml", {"log.trace.steps=[1, 51]"}, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("traces 51 steps") != std::string::npos);
  warnings.clear();
  dtrain::parse_job_spec("train: {steps: 100}\n", "t.yaml", {"log.trace.steps=[1, 50]"}, &warnings);
  CHECK(warnings.empty());
}
