// What `dtrain launch` refuses or protects before any worker starts, with
// the real binary and no training: a job whose predicted memory per rank
// (dtrain plan's model: activations, MoE experts, the naive attention's
// masks) is more than this machine can hold; a job.name the rendezvous and
// the lock files cannot carry; a run directory held by a job of the same
// name and token at another rendezvous; an earlier metrics.jsonl whose
// archive name is taken. Also `plan` and `validate` counting MoE experts,
// and scripts/plot-metrics reading a metrics.jsonl with malformed lines.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

using dtrain::testing::TempDir;
using dtrain::testing::read_file;
using dtrain::testing::write_file;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::pair<int, std::string> dtrain_cmd(const TempDir& dir, const std::string& name, std::vector<std::string> args,
                                       const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), dtrain::testing::dtrain_bin());
  return dtrain::testing::run_command(args, dir / (name + ".log"), 60, env);
}

// Four CPU ranks of a small GPT on synthetic data; the worker is `true`, so
// nothing would train even if a check let the job through.
std::string guard_spec(const TempDir& dir, const std::string& name = "guard") {
  return "job: {name: " + name + ", seed: 1}\n"
         "cluster: {nodes: 1, procs_per_node: 4, device: cpu, backend: gloo}\n"
         "parallel: {dp: 4}\n"
         "model: {kind: gpt, vocab: 256, layers: 4, d_model: 256, heads: 4, seq_len: 64}\n"
         "train: {steps: 2, micro_batch: 8, warmup_steps: 1}\n"
         "data: {format: synthetic}\n"
         "log: {dir: " + (dir / "run") + "}\n"
         "entrypoint: [true]\n";
}

std::string port_set() { return "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(dtrain::testing::free_port()); }

}  // namespace

TEST_CASE("launch: a job over this machine's memory exits 2 before any worker, naming the figure, budget and fix") {
  TempDir dir;
  write_file(dir / "spec.yaml", guard_spec(dir));
  struct Case {
    std::string set, part, field;
  };
  // The figures are hundreds of GB to TB per rank (the plan prints them):
  // more than any machine's memory over 4 ranks.
  const std::vector<Case> cases = {
      {"train.micro_batch=100000", "activations", "train.micro_batch = 100000"},
      {"model.moe.experts=100000", "params + grads + optimizer", "model.moe.experts = 100000"},
      {"model.seq_len=100000", "activations", "model.seq_len = 100000"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.set);
    auto [code, out] = dtrain_cmd(dir, "oom", {"launch", dir / "spec.yaml", "--set", c.set, "--set", port_set()});
    INFO(out);
    CHECK(code == 2);
    CHECK(has(out, "this machine's memory, "));
    CHECK(has(out, "for cluster.procs_per_node = 4 rank(s)"));
    CHECK(has(out, "is below the predicted peak"));
    CHECK(has(out, "largest part: " + c.part));
    CHECK(has(out, c.field));
    CHECK(has(out, "activations"));  // the plan's table
    CHECK((has(out, "the cheapest change that fits: --set ") || has(out, "add ranks")));
    CHECK(has(out, "--allow-large"));
    CHECK(!has(out, "[rank"));                          // no worker logged anything
    CHECK(!std::filesystem::exists(dir / "run/spec.resolved.yaml"));  // nothing started
  }
  // The same spec without the change starts (and its `true` workers end).
  auto [code, out] = dtrain_cmd(dir, "fits", {"launch", dir / "spec.yaml", "--set", port_set()});
  INFO(out);
  CHECK(code == 0);
}

TEST_CASE("plan and validate count MoE experts: E / ep per rank, param + grad + AdamW") {
  TempDir dir;
  write_file(dir / "spec.yaml", guard_spec(dir));
  auto json_of = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{'))); };
  auto plan = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"plan", dir / "spec.yaml", "--format", "json", "--no-probe"};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    auto [code, out] = dtrain_cmd(dir, "plan", args);
    INFO(out);
    REQUIRE(code == 0);
    return json_of(out);
  };
  const double h = 256, F = 4 * h, layers = 4, E = 8, ep = 2;
  // One rank's parameters: a MoE block swaps the MLP (8h^2 + 5h) for the
  // router (hE) and E / ep experts of 2hF + F + h each.
  const double delta = layers * (h * E - (8 * h * h + 5 * h) + E / ep * (2 * h * F + F + h));
  const auto dense = plan({}), moe = plan({"model.moe.experts=8", "parallel.ep=2"});
  const double got = double(moe["ranks"][0]["param_bytes"]) - double(dense["ranks"][0]["param_bytes"]);
  MESSAGE("plan: MoE param bytes per rank minus dense " << got << ", expected 4 x " << delta);
  CHECK(got == doctest::Approx(4 * delta));
  CHECK(double(moe["ranks"][0]["optimizer_bytes"]) - double(dense["ranks"][0]["optimizer_bytes"]) ==
        doctest::Approx(8 * delta));

  auto validate = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"validate", dir / "spec.yaml", "--format", "json"};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    auto [code, out] = dtrain_cmd(dir, "validate", args);
    INFO(out);
    REQUIRE(code == 0);
    return json_of(out)["derived"];
  };
  const auto vd = validate({}), vm = validate({"model.moe.experts=8", "parallel.ep=2"});
  const double whole = layers * (h * E - (8 * h * h + 5 * h) + E * (2 * h * F + F + h));
  CHECK(double(vm["params"]) - double(vd["params"]) == doctest::Approx(whole));
  CHECK(double(vm["train_state_bytes_per_rank"]) - double(vd["train_state_bytes_per_rank"]) ==
        doctest::Approx(16 * delta));
  // validate refuses what launch refuses.
  auto [code, out] = dtrain_cmd(dir, "validate_oom", {"validate", dir / "spec.yaml", "--set", "model.moe.experts=100000"});
  INFO(out);
  CHECK(code == 2);
  CHECK(has(out, "is below the predicted peak"));
}

TEST_CASE("plan counts the bytes dataset's host copy (about twice the file) in the need it checks") {
  TempDir dir;
  write_file(dir / "text.txt", std::string(1 << 20, 'x'));  // 1 MiB of tokens
  write_file(dir / "spec.yaml", guard_spec(dir));
  const std::vector<std::string> data = {"--set", "data.format=bytes", "--set", "data.path=" + (dir / "text.txt"),
                                         "--set", "entrypoint=builtin"};
  auto plan = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args = {"plan", dir / "spec.yaml", "--format", "json", "--no-probe"};
    args.insert(args.end(), data.begin(), data.end());
    args.insert(args.end(), more.begin(), more.end());
    return dtrain_cmd(dir, "plan_data", args);
  };
  auto [code, out] = plan({});
  INFO(out);
  REQUIRE(code == 0);
  const auto rank0 = nlohmann::json::parse(out.substr(out.find('{')))["ranks"][0];
  REQUIRE(rank0.contains("data_bytes"));
  CHECK(rank0["data_bytes"] == 2 << 20);
  const int64_t peak = rank0["peak_bytes"], need = rank0["need_bytes"];
  CHECK(need == std::max<int64_t>(peak, rank0["build_bytes"]) + (2 << 20));
  // A budget between the tensor peak and the need is refused; the need itself fits.
  auto [over, over_out] = plan({"--memory-per-rank", std::to_string(need - (1 << 20))});
  INFO(over_out);
  CHECK(over == 2);
  CHECK(has(over_out, "is below the predicted peak"));
  auto [fits, fits_out] = plan({"--memory-per-rank", std::to_string(need)});
  INFO(fits_out);
  CHECK(fits == 0);
}

TEST_CASE("launch: a 3 MB, non-UTF-8 or multi-line job.name exits 2 at spec load naming the field and the fix") {
  TempDir dir;
  struct Case {
    std::string name, yaml_name, expect;
  };
  const std::vector<Case> cases = {
      {"3 MB", std::string(3 << 20, 'a'), "(3145728 bytes) is longer than 128 bytes"},
      {"not UTF-8", "job\xff\xfe", "is not valid UTF-8 (byte 0xff at offset 3)"},  // raw bytes in the file
      {"newline", "\"two\\nlines\"", "holds a control character at offset 3"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    std::filesystem::remove_all(dir / "run");
    write_file(dir / "spec.yaml", guard_spec(dir, c.yaml_name));
    auto [code, out] = dtrain_cmd(dir, "name", {"launch", dir / "spec.yaml", "--set", port_set()});
    INFO(out.substr(0, 4000));
    CHECK(code == 2);
    CHECK(has(out, "spec.yaml:1:"));
    CHECK(has(out, "job.name = \""));
    CHECK(has(out, c.expect));
    CHECK(has(out, "use a short name of letters, digits"));
    CHECK(out.size() < 16 * 1024);  // an excerpt, not the value
    CHECK(!std::filesystem::exists(dir / "run/spec.resolved.yaml"));
  }
}

TEST_CASE("run dir lock: a job of the same name and token at another rendezvous is refused, naming both") {
  TempDir dir;
  write_file(dir / "spec.yaml",
             "job: {name: guard, seed: 1}\n"
             "cluster: {nodes: 2, procs_per_node: 1, device: cpu, backend: gloo, rendezvous: {join_timeout_s: 60}}\n"
             "parallel: {dp: 2}\n"
             "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 16}\n"
             "train: {steps: 1, micro_batch: 2}\n"
             "data: {format: synthetic}\n"
             "log: {dir: " + (dir / "run") + "}\n"
             "entrypoint: [true]\n");
  const std::vector<std::string> env = {"DTRAIN_TOKEN=same-token"};
  const std::string p1 = "127.0.0.1:" + std::to_string(dtrain::testing::free_port());
  // Job A: node 0 of a 2-node job, serving rendezvous p1 and waiting there
  // for its second node, holding log.dir.
  dtrain::testing::Child a({dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--node-rank", "0", "--rdzv", p1},
                           dir / "a.log", env);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!has(read_file(dir / "run/.dtrain.lock"), "job_id=") && std::chrono::steady_clock::now() < deadline &&
         !a.wait(0.05)) {
  }
  REQUIRE_MESSAGE(has(read_file(dir / "run/.dtrain.lock"), "job_id="), a.output());
  // Job B: the same name and token, another rendezvous.
  const std::string p2 = "127.0.0.1:" + std::to_string(dtrain::testing::free_port());
  auto [code, out] = dtrain_cmd(dir, "b", {"launch", dir / "spec.yaml", "--node-rank", "0", "--rdzv", p2, "--set",
                                           "cluster.rendezvous.join_timeout_s=2"}, env);
  INFO(out);
  CHECK(code == 2);
  CHECK(has(out, "log.dir = " + (dir / "run") + ": is in use by job 'guard'"));
  CHECK(has(out, "at rendezvous " + p1 + " (this agent's: " + p2 + ")"));
  CHECK(has(out, "spell its endpoint the same way on every node"));
  CHECK(a.running());
  a.kill_all();
}

TEST_CASE("a fresh start never overwrites an earlier metrics archive, even within one second") {
  TempDir dir;
  const std::string run = dir / "run";
  std::filesystem::create_directories(run);
  write_file(dir / "spec.yaml",
             "job: {name: fresh, seed: 1}\n"
             "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
             "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 16}\n"
             "train: {steps: 1, micro_batch: 2}\n"
             "data: {format: synthetic}\n"
             "log: {dir: " + run + "}\n"
             "entrypoint: [sh, -c, 'echo \"{\\\"step\\\": 1, \\\"loss\\\": 3}\" > " + run + "/metrics.jsonl']\n");
  // The run before this one (metrics.jsonl) and the archives of runs that
  // started in each of the next seconds (as two --fresh runs in one second
  // leave them): this launch's own second is among them.
  write_file(run + "/metrics.jsonl", "{\"step\": 1, \"loss\": 9.5}\n");
  std::vector<std::string> archives;
  const std::time_t now = std::time(nullptr);
  for (int s = 0; s < 30; ++s) {
    std::time_t t = now + s;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H%M%SZ", &tm);
    archives.push_back(run + "/metrics.before_" + stamp + ".jsonl");
    write_file(archives.back(), "archive " + std::to_string(s) + "\n");
  }
  auto [code, out] = dtrain_cmd(dir, "fresh", {"launch", dir / "spec.yaml", "--fresh", "--set", port_set()});
  INFO(out);
  REQUIRE(code == 0);
  for (size_t s = 0; s < archives.size(); ++s) CHECK(read_file(archives[s]) == "archive " + std::to_string(s) + "\n");
  int holding_earlier = 0;
  for (const auto& e : std::filesystem::directory_iterator(run))
    if (read_file(e.path().string()) == "{\"step\": 1, \"loss\": 9.5}\n") ++holding_earlier;
  CHECK(holding_earlier == 1);  // the earlier run's metrics survive, once
  CHECK(has(out, "the earlier metrics.jsonl is now " + run + "/metrics.before_"));
}

TEST_CASE("plot-metrics skips malformed lines with a warning count instead of a traceback") {
  TempDir dir;
  write_file(dir / "metrics.jsonl",
             "{\"step\": 1, \"loss\": 5.5}\n"
             "[1, 2]\n"
             "{\"step\": 2, \"loss\": null, \"nonfinite\": true}\n"
             "\xff\xfe not utf-8\n"
             "{\"step\": 3, \"loss\": 4.0}\n"
             "nan\n"
             "{\"step\": 4, \"lo");
  const std::string python = dtrain::testing::python();
  REQUIRE_MESSAGE(!python.empty(), "no Python was found at configure time: run scripts/install-deps");
  auto [code, out] = dtrain::testing::run_command(
      {python, dtrain::testing::source_dir() + "/scripts/plot-metrics", dir / "metrics.jsonl", "-o", dir / "l.svg"},
      dir / "plot.log", 60);
  INFO(out);
  CHECK(code == 0);
  CHECK(!has(out, "Traceback"));
  CHECK(has(out, "skipped 5 malformed line(s) (first: line 2: not a JSON object (list))"));
  CHECK(has(out, ": 2 points, loss 5.5000 (step 1) -> 4.0000 (step 3)"));
  CHECK(std::filesystem::exists(dir / "l.svg"));
}
