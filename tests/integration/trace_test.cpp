// Observability through the real binaries: a pp 2 1f1b run traced for two
// steps, merged by `dtrain trace merge` into one Chrome trace whose pipeline
// actions per stage follow `dtrain topo --schedule`'s plan, whose spans lie
// inside their step and whose collectives carry op, group and bytes; the bad
// inputs (log.trace.steps, merge without a trace, onto an existing file);
// and the pictures, rendered with rsvg-convert and measured from the SVG
// (tests/support/svg_geometry.py): plot-metrics with a first loss above the
// last round tick and val_loss lines, `dtrain topo --svg configs/gpt-3d.yaml`.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

using namespace dtrain::testing;
using nlohmann::json;

constexpr int kSteps = 3;

std::string spec_text(const TempDir& dir) {
  return "job: {name: trace, seed: 5}\n"
         "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: gloo}\n"
         "parallel: {dp: 1, pp: 2, pipeline: {schedule: 1f1b}}\n"
         "model: {kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}\n"
         "train: {steps: " + std::to_string(kSteps) + ", micro_batch: 2, grad_accum: 4, lr: 3.0e-3, warmup_steps: 1}\n"
         "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
         "checkpoint: {dir: " + (dir / "ckpt") + "}\n"
         "log: {dir: " + (dir / "run") + ", every: 1, tensorboard: false, trace: {steps: [2, 3]}}\n"
         "entrypoint: builtin\n";
}

// The traced run and its merged trace, made once for the cases below.
struct Traced {
  TempDir dir;
  json trace;
  std::string topo;  // `dtrain topo --schedule` of the same spec
  Traced() {
    TagGuard tag;
    write_file(dir / "text.txt", word_salad(16 * 1024, {"trace ", "every ", "stage\n"}));
    write_file(dir / "spec.yaml", spec_text(dir));
    auto [code, out] = run_command({dtrain_bin(), "launch", dir / "spec.yaml", "--set",
                                    "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
                                   dir / "launch.log", 240, {tag.env(), "DTRAIN_OP_PROFILE=" + (dir / "ops")});
    INFO(out);
    REQUIRE(code == 0);
    auto [mcode, mout] = run_command({dtrain_bin(), "trace", "merge", dir / "run", dir / "trace.json"},
                                     dir / "merge.log");
    INFO(mout);
    REQUIRE(mcode == 0);
    trace = json::parse(read_file(dir / "trace.json"));
    auto [tcode, tout] = run_command({dtrain_bin(), "topo", dir / "spec.yaml", "--schedule"}, dir / "topo.log");
    INFO(tout);
    REQUIRE(tcode == 0);
    topo = tout;
  }
  static Traced& get() {
    static Traced t;
    return t;
  }
};

// "stage 1: F0 RECV_B0 ..." lines of `topo --schedule`, per stage.
std::map<int, std::vector<std::string>> plan_of(const std::string& topo) {
  std::map<int, std::vector<std::string>> plan;
  std::istringstream in(topo);
  static const std::regex line("^stage ([0-9]+):(.*)$");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_match(l, m, line)) continue;
    std::istringstream actions(m[2].str());
    for (std::string a; actions >> a;) plan[std::stoi(m[1])].push_back(a);
  }
  return plan;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

// svg_geometry.py's verdict on `svg`, then an rsvg-convert rendering of it.
void check_picture(const TempDir& dir, const std::string& svg) {
  auto [gcode, gout] = run_command({python(), source_dir() + "/tests/support/svg_geometry.py", svg}, svg + ".geometry.log");
  MESSAGE(gout);
  CHECK(gcode == 0);
  const std::string rsvg = find_in_path("rsvg-convert");
  REQUIRE_MESSAGE(!rsvg.empty(), "rsvg-convert is not installed: run scripts/install-deps (librsvg2-bin)");
  auto [rcode, rout] = run_command({rsvg, svg, "-o", svg + ".png"}, dir / "rsvg.log");
  INFO(rout);
  CHECK(rcode == 0);
  CHECK(std::filesystem::file_size(svg + ".png") > 1000);
}

}  // namespace

TEST_CASE("trace: one pid per rank, named by its coordinates; the clock offsets are stored") {
  const json& t = Traced::get().trace;
  std::set<int> pids;
  std::map<int, std::string> names;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") pids.insert(int(e["pid"]));
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
  }
  CHECK(pids == std::set<int>{0, 1});
  CHECK(names[0] == "rank 0 (tp0 pp0 dp0)");
  CHECK(names[1] == "rank 1 (tp0 pp1 dp0)");
  REQUIRE(t["otherData"]["clock"].size() == 2);
  MESSAGE("clock offsets: " << t["otherData"]["clock"].dump());
  // One host: both ranks read the same steady clock, so the true offset is 0
  // and the estimate (the middle of a round trip that holds rank 0's
  // reading) cannot be further from it than half that round trip.
  for (const auto& c : t["otherData"]["clock"]) {
    INFO(c.dump());
    CHECK(std::llabs(c["offset_ns"].get<long long>()) <= c["rtt_ns"].get<long long>() / 2 + 1);
  }
  CHECK(t["otherData"]["clock"][1]["rtt_ns"].get<long long>() > 0);
}

TEST_CASE("trace: each stage's pipeline actions, per step, in the order topo --schedule prints") {
  const Traced& tr = Traced::get();
  const auto plan = plan_of(tr.topo);
  REQUIRE(plan.size() == 2);
  static const std::regex action("^(F|B|BI|W|SEND_F|RECV_F|SEND_B|RECV_B)[0-9]+$");
  std::map<std::pair<int, int>, std::vector<std::pair<double, std::string>>> done;  // (stage, step) -> actions
  for (const auto& e : tr.trace["traceEvents"]) {
    if (e["ph"] != "X" || !std::regex_match(e["name"].get<std::string>(), action)) continue;
    done[{e["args"]["stage"], e["args"]["step"]}].push_back({e["ts"], e["name"]});
  }
  REQUIRE(done.size() == 4);  // 2 stages x steps 2 and 3
  for (auto& [key, actions] : done) {
    std::sort(actions.begin(), actions.end());
    std::vector<std::string> names;
    for (auto& a : actions) names.push_back(a.second);
    auto joined = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& a : v) out += " " + a;
      return out;
    };
    INFO("stage " << key.first << " step " << key.second << "\n traced:" << joined(names) << "\n plan:  "
                  << joined(plan.at(key.first)));
    CHECK(names == plan.at(key.first));
  }
}

TEST_CASE("trace: every span lies within its step's span; collectives carry op, group and bytes") {
  const json& t = Traced::get().trace;
  std::map<std::pair<int, int>, std::pair<double, double>> steps;  // (pid, step) -> [begin, end] us
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "step")
      steps[std::make_pair(e["pid"].get<int>(), e["args"]["step"].get<int>())] = {e["ts"], double(e["ts"]) + double(e["dur"])};
  REQUIRE(steps.size() == 4);
  int spans = 0, collectives = 0;
  std::set<std::string> seen;
  std::set<std::pair<int, std::string>> kinds;  // (pid, cat)
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] == "step") continue;
    const auto [begin, end] = steps.at(std::make_pair(e["pid"].get<int>(), e["args"]["step"].get<int>()));
    const double ts = e["ts"], stop = ts + double(e["dur"]);
    INFO(e.dump());
    CHECK(ts >= begin - 1e-3);
    CHECK(stop <= end + 1e-3);
    ++spans;
    kinds.insert(std::make_pair(e["pid"].get<int>(), e["cat"].get<std::string>()));
    if (e["cat"] != "collective") continue;
    ++collectives;
    REQUIRE(e["args"].contains("op"));
    REQUIRE(e["args"].contains("group"));
    REQUIRE(e["args"].contains("bytes"));
    CHECK(e["args"]["wait_us"].get<double>() >= 0);
    seen.insert(e["args"]["op"].get<std::string>() + " " + e["args"]["group"].get<std::string>());
    if (e["args"]["op"] == "send") CHECK(e["args"]["bytes"].get<uint64_t>() == 2 * 32 * 32 * 4);  // [B, T, C] fp32
  }
  MESSAGE(spans << " spans checked, " << collectives << " collectives: " << json(seen).dump());
  CHECK(seen.count("all_reduce pp"));
  CHECK(seen.count("send pp"));
  CHECK(seen.count("recv pp"));
  for (int pid : {0, 1})
    for (const char* cat : {"forward", "backward", "data", "grad_sync", "optimizer", "checkpoint"}) {
      INFO("rank " << pid << " span kind " << cat);
      CHECK(kinds.count({pid, cat}));
    }
}

TEST_CASE("DTRAIN_OP_PROFILE: each rank's operators by caller, self within total, within the step's wall time") {
  const TempDir& dir = Traced::get().dir;
  for (int r = 0; r < 2; ++r) {
    const std::string text = read_file(dir / ("ops/op_profile_rank_" + std::to_string(r) + ".txt"));
    INFO(text.substr(0, 2000));
    std::smatch m;
    REQUIRE(std::regex_search(text, m, std::regex(R"(rank (\d+): (\d+) steps recorded .*, ([0-9.]+) wall ms per step)")));
    CHECK(std::stoi(m[1]) == r);
    CHECK(std::stoi(m[2]) == kSteps - 1);  // the first step left out
    const double wall = std::stod(m[3]);
    REQUIRE(std::regex_search(text, m, std::regex(R"(# ([0-9.]+) ms per step inside operators)")));
    const double inside = std::stod(m[1]);
    MESSAGE("rank " << r << ": " << inside << " ms per step inside operators of " << wall << " wall");
    CHECK(inside > 0);
    CHECK(inside <= wall);
    // Rows: self_ms self_% total_ms calls key; the GEMMs of every linear layer are there.
    std::istringstream in(text);
    std::string line;
    int rows = 0, gemms = 0;
    while (std::getline(in, line)) {
      double self = 0, pct = 0, total = 0, calls = 0;
      char key[512] = {};
      if (line.empty() || line[0] == '#' || std::sscanf(line.c_str(), "%lf %lf %lf %lf %511[^\n]", &self, &pct,
                                                          &total, &calls, key) != 5)
        continue;
      ++rows;
      CHECK(self <= total + 1e-3);
      CHECK(std::string(key).find(" <- ") != std::string::npos);
      if (std::string(key).rfind("aten::mm <- ", 0) == 0 || std::string(key).rfind("aten::addmm <- ", 0) == 0)
        gemms += calls > 0 && self > 0;
    }
    CHECK(rows > 10);
    CHECK(gemms > 0);
  }
}

TEST_CASE("trace: bad input is refused before anything runs or is overwritten") {
  TempDir dir;
  write_file(dir / "text.txt", "x");
  write_file(dir / "spec.yaml", spec_text(dir));
  for (const std::string steps : {"[3, 2]", "[2, 4]", "[0, 1]"}) {
    auto [code, out] = run_command({dtrain_bin(), "launch", dir / "spec.yaml", "--set", "log.trace.steps=" + steps},
                                   dir / "launch.log");
    INFO(out);
    CHECK(code == 2);
    CHECK(out.find("log.trace.steps = " + steps) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "run"));  // no worker, no log dir
  }
  auto [wcode, wout] = run_command({dtrain_bin(), "validate", dir / "spec.yaml", "--set", "train.steps=100", "--set",
                                    "log.trace.steps=[1, 60]"},
                                   dir / "validate.log");
  INFO(wout);
  CHECK(wcode == 0);
  CHECK(wout.find("traces 60 steps") != std::string::npos);
  // merge: a directory without a trace; an existing output file.
  std::filesystem::create_directories(dir / "empty");
  auto [ncode, nout] = run_command({dtrain_bin(), "trace", "merge", dir / "empty", dir / "out.json"}, dir / "m1.log");
  INFO(nout);
  CHECK(ncode == 2);
  CHECK(nout.find("holds no timeline trace") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "out.json"));
  write_file(dir / "out.json", "keep me");
  auto [ecode, eout] = run_command({dtrain_bin(), "trace", "merge", Traced::get().dir / "run", dir / "out.json"},
                                   dir / "m2.log");
  INFO(eout);
  CHECK(ecode == 2);
  CHECK(eout.find("--force") != std::string::npos);
  CHECK(read_file(dir / "out.json") == "keep me");
}

TEST_CASE("pictures: plot-metrics holds every point in its frame and draws val_loss with a legend") {
  TempDir dir;
  std::filesystem::create_directories(dir / "run");
  // The quickstart's shape: a first loss (5.545) above the last round tick
  // of the rest, and evaluation lines that carry only val_loss.
  const double losses[] = {5.545, 4.9, 4.3, 3.9, 3.6, 3.4, 3.3, 3.25, 3.21, 3.2};
  std::string lines;
  for (int i = 0; i < 10; ++i) {
    lines += "{\"step\": " + std::to_string(10 * (i + 1)) + ", \"loss\": " + std::to_string(losses[i]) + "}\n";
    if (i % 3 == 2)
      lines += "{\"step\": " + std::to_string(10 * (i + 1)) + ", \"val_loss\": " + std::to_string(losses[i] + 0.1) + "}\n";
  }
  write_file(dir / "run/metrics.jsonl", lines);
  auto [code, out] = run_command({python(), source_dir() + "/scripts/plot-metrics", dir / "run", "-o", dir / "loss.svg"},
                                 dir / "plot.log");
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("malformed") == std::string::npos);  // val_loss lines are records, not faults
  CHECK(out.find("run: 3 val_loss points") != std::string::npos);
  const std::string svg = read_file(dir / "loss.svg");
  CHECK(svg.find("stroke-dasharray") != std::string::npos);  // the val_loss curve and its legend line
  CHECK(svg.find("run val_loss: 4.400 -> 3.310") != std::string::npos);
  check_picture(dir, dir / "loss.svg");
}

TEST_CASE("pictures: topo --svg of configs/gpt-3d.yaml labels links without overlaps") {
  TempDir dir;
  auto [code, out] = run_command(
      {dtrain_bin(), "topo", source_dir() + "/configs/gpt-3d.yaml", "--svg", dir / "topo.svg"}, dir / "topo.log");
  INFO(out);
  REQUIRE(code == 0);
  check_picture(dir, dir / "topo.svg");
}
