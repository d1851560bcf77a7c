// The user-facing commands around a job, with the real binaries: `dtrain
// validate` (derived sizes in JSON, a bad spec refused naming the field),
// `dtrain launch` refusing what the engine cannot run before it starts, and
// scripts/plot-metrics (a well-formed SVG whose curve is the run's losses).
// Training runs are 1 process and a dozen steps of a tiny model.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

using dtrain::testing::TempDir;
using json = nlohmann::json;

std::pair<int, std::string> dtrain_cmd(const TempDir& dir, const std::string& name,
                                       std::vector<std::string> args) {
  args.insert(args.begin(), dtrain::testing::dtrain_bin());
  return dtrain::testing::run_command(args, dir / (name + ".log"), 60);
}

// Everything from the first '{' on: the JSON document stdout holds.
json json_of(const std::string& output) { return json::parse(output.substr(output.find('{'))); }

const char* kSpec =
    "job: {name: cli, seed: 7}\n"
    "cluster: {nodes: 2, procs_per_node: 4}\n"
    "parallel: {dp: 2, tp: 2, pp: 2}\n"
    "model: {layers: 4, d_model: 64, heads: 4, seq_len: 64}\n"
    "train: {micro_batch: 3, grad_accum: 4}\n";

}  // namespace

TEST_CASE("validate --format json: the resolved spec and every derived size") {
  TempDir dir;
  dtrain::testing::write_file(dir / "spec.yaml", kSpec);
  auto [code, out] = dtrain_cmd(dir, "validate", {"validate", dir / "spec.yaml", "--format", "json"});
  INFO(out);
  REQUIRE(code == 0);
  json j = json_of(out);
  CHECK(j["source"] == dir / "spec.yaml");
  CHECK(j["spec"]["parallel"]["tp"] == 2);
  CHECK(j["spec"]["train"]["micro_batch"] == 3);
  const json& d = j["derived"];
  CHECK(d["world"] == 8);                      // dp * tp * pp
  CHECK(d["mesh"] == json({{"dp", 2}, {"tp", 2}, {"pp", 2}, {"ep", 1}}));
  CHECK(d["nodes"] == json({{"min", 2}, {"max", 2}}));
  CHECK(d["ranks_per_node"] == 4);
  CHECK(d["global_batch"] == 24);              // micro_batch 3 * grad_accum 4 * dp 2
  CHECK(d["tokens_per_step"] == 24 * 64);      // global batch * seq_len
  CHECK(j["warnings"].is_array());

  // --set changes the derived values too.
  auto [code2, out2] = dtrain_cmd(dir, "validate_set",
                                  {"validate", dir / "spec.yaml", "--format", "json", "--set",
                                   "parallel.dp=4", "--set", "cluster.procs_per_node=8"});
  INFO(out2);
  REQUIRE(code2 == 0);
  json d2 = json_of(out2)["derived"];
  CHECK(d2["world"] == 16);
  CHECK(d2["global_batch"] == 48);
  CHECK(d2["tokens_per_step"] == 48 * 64);
}

TEST_CASE("validate: a bad spec exits 2 naming the file, the field and the fix") {
  TempDir dir;
  struct Case {
    std::string name, yaml;
    std::vector<std::string> sets;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"tp does not divide heads", kSpec, {"--set", "parallel.tp=3"},
       {"parallel.tp = 3 does not divide model.heads = 4", "use tp 1, 2 or 4"}},
      {"unknown key", "job: {name: x}\nparalel: {dp: 1}\n", {},
       {"spec.yaml:2:1: unknown key 'paralel' (did you mean parallel?)"}},
      {"bad value", "parallel: {dp: 0}\n", {}, {"spec.yaml:1:16: parallel.dp = 0: must be >= 1"}},
      // Features the engine cannot run together (plan/combinations.h), and the parameter maximum.
      {"zero 3 with pp", kSpec, {"--set", "parallel.zero=3"},
       {"spec.yaml: this spec asks for what the builtin engine cannot run:",
        "parallel.zero = 3 with parallel.pp = 2 is not implemented yet; use zero 0, 1 or 2 with pp"}},
      {"too many parameters", kSpec, {"--set", "model.d_model=4096", "--set", "model.layers=100000"},
       {"spec.yaml: model.d_model = 4096, model.layers = 100000, model.vocab = 256: 2.01e+13 parameters, "
        "more than the maximum 1e12"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    dtrain::testing::write_file(dir / "spec.yaml", c.yaml);
    std::vector<std::string> args = {"validate", dir / "spec.yaml", "--format", "json"};
    args.insert(args.end(), c.sets.begin(), c.sets.end());
    auto [code, out] = dtrain_cmd(dir, "bad", args);
    INFO(out);
    CHECK(code == 2);
    for (const auto& e : c.expect) CHECK(out.find(e) != std::string::npos);
    CHECK(out.find("\"derived\"") == std::string::npos);  // nothing printed as if valid
  }
}

TEST_CASE("launch: features the engine cannot run together exit 2 before anything starts") {
  TempDir dir;
  dtrain::testing::write_file(dir / "spec.yaml", std::string(kSpec) + "log: {dir: " + (dir / "run") + "}\n");
  auto [code, out] = dtrain_cmd(dir, "launch_zero3_pp",
                                {"launch", dir / "spec.yaml", "--set", "cluster.nodes=1", "--set",
                                 "cluster.procs_per_node=8", "--set", "parallel.zero=3"});
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("parallel.zero = 3 with parallel.pp = 2 is not implemented yet") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "run"));  // no log dir: no rendezvous, no worker
}

TEST_CASE("plot-metrics: a well-formed SVG whose polyline is the run's loss curve") {
  TempDir dir;
  dtrain::testing::TagGuard tag;
  const int steps = 12;
  dtrain::testing::write_file(
      dir / "text.txt", dtrain::testing::word_salad(16 * 1024, {"plot ", "the ", "loss ", "curve\n"}));
  dtrain::testing::write_file(
      dir / "spec.yaml",
      "job: {name: plot, seed: 3}\n"
      "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
      "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}\n"
      "train: {steps: " + std::to_string(steps) + ", micro_batch: 4, lr: 3.0e-3, warmup_steps: 2}\n"
      "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
      "log: {dir: " + (dir / "run") + ", every: 1}\n"
      "entrypoint: builtin\n");
  auto [code, out] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--set",
       "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(dtrain::testing::free_port())},
      dir / "launch.log", 120, {tag.env()});
  INFO(out);
  REQUIRE(code == 0);
  std::vector<double> losses;
  {
    std::ifstream in(dir / "run/metrics.jsonl");
    for (std::string line; std::getline(in, line);) losses.push_back(json::parse(line)["loss"]);
  }
  REQUIRE(losses.size() == size_t(steps));

  const std::string python = dtrain::testing::python();
  REQUIRE_MESSAGE(!python.empty(), "no Python with torch was found at configure time: run scripts/install-deps");
  auto [pcode, pout] = dtrain::testing::run_command(
      {python, dtrain::testing::source_dir() + "/scripts/plot-metrics", dir / "run", "-o", dir / "loss.svg"},
      dir / "plot.log", 60);
  INFO(pout);
  REQUIRE(pcode == 0);
  CHECK(pout.find("run: " + std::to_string(steps) + " points") != std::string::npos);
  auto [scode, sout] = dtrain::testing::run_command(
      {python, dtrain::testing::source_dir() + "/tests/support/svg_points.py", dir / "loss.svg"},
      dir / "svg.log", 60);
  INFO(sout);
  REQUIRE(scode == 0);  // the XML parser read it, and its root is <svg>
  REQUIRE(sout.rfind("polyline ", 0) == 0);
  REQUIRE(sout.find("polyline ", 1) == std::string::npos);  // one run, one curve
  std::vector<double> xs, ys;
  std::istringstream points(sout.substr(9));
  for (std::string p; points >> p;) {
    xs.push_back(std::strtod(p.c_str(), nullptr));
    ys.push_back(std::strtod(p.c_str() + p.find(',') + 1, nullptr));
  }
  REQUIRE(xs.size() == size_t(steps));
  // x: one point per step, evenly spaced; y: the loss, linearly (higher loss
  // drawn higher, smaller y), to the 0.1 px the file is written with.
  const double dx = (xs.back() - xs.front()) / (steps - 1);
  const double scale = (ys.back() - ys.front()) / (losses.back() - losses.front());
  CHECK(dx > 0);
  CHECK(scale < 0);
  double worst = 0;
  for (int i = 0; i < steps; ++i) {
    worst = std::max(worst, std::fabs(xs[size_t(i)] - (xs.front() + i * dx)));
    worst = std::max(worst, std::fabs(ys[size_t(i)] - (ys.front() + scale * (losses[size_t(i)] - losses.front()))));
  }
  MESSAGE("SVG polyline vs the metrics: max deviation " << worst << " px (tolerance 0.25 px); loss "
                                                        << losses.front() << " -> " << losses.back());
  CHECK(worst <= 0.25);
}

TEST_CASE("topo --schedule: each stage's action list and the predicted bubble, as the engine runs them") {
  TempDir dir;
  dtrain::testing::write_file(dir / "spec.yaml", kSpec);
  auto [code, out] = dtrain_cmd(dir, "topo_schedule", {"topo", dir / "spec.yaml", "--schedule"});
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("pipeline schedule 1f1b, pp 2, 4 micro-batch(es)") != std::string::npos);
  CHECK(out.find("stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 F2") != std::string::npos);
  CHECK(out.find("stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1") != std::string::npos);
  CHECK(out.find("bubble 0.200 (ideal 0.200)") != std::string::npos);  // (p-1)/(m+p-1) = 1/5
  auto [gcode, gout] = dtrain_cmd(dir, "topo_gpipe",
                                  {"topo", dir / "spec.yaml", "--schedule", "--set", "parallel.pipeline.schedule=gpipe"});
  CHECK(gcode == 0);
  CHECK(gout.find("in flight 4 4") != std::string::npos);  // GPipe holds every micro-batch
}
