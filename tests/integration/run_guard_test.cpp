// A run that goes wrong under it, with the real `dtrain` on 2 ranks: a
// diverging run (train.lr = 1e4, no clipping) stops with exit 2 naming the
// step, the value and the fix, keeps its last finite checkpoint and leaves a
// metrics.jsonl that parses line by line; train.nonfinite = skip_step skips
// a NaN step (fault.kind nan_grad on one rank) and trains on, and on a
// diverged run leaves out every save after it, the final one too; a tokens-u16
// file truncated mid-run stops the run with a config error naming the file,
// which is not restarted (cluster.max_restarts 1).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::wait_until;
using dtrain::testing::TempDir;
using dtrain::testing::free_port;
using dtrain::testing::read_file;
using dtrain::testing::write_file;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// metrics.jsonl's step records (every line parsed as JSON; checkpoint
// records, {"step", "ckpt_block_ms", ...} without a loss, left out); `bad`
// collects the lines that are not JSON.
std::vector<nlohmann::json> metrics_lines(const std::string& path, std::vector<std::string>* bad) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      if (bad) bad->push_back(line);
      continue;
    }
    if (j.contains("loss")) out.push_back(std::move(j));
  }
  return out;
}

// A tiny GPT on 2 ranks (dp 2), log.every 1, one restart allowed.
struct Run {
  TempDir dir;
  TagGuard tag;
  explicit Run(const std::string& data_lines) {
    write_file(dir / "spec.yaml",
               "job: {name: run-guard, seed: 11}\n"
               "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: gloo, max_restarts: 1, grace_s: 2}\n"
               "parallel: {dp: 2}\n"
               "model: {kind: gpt, vocab: 256, layers: 1, d_model: 16, heads: 2, seq_len: 16}\n"
               "train: {steps: 8, micro_batch: 2, lr: 1.0e-3, warmup_steps: 1}\n" +
                   data_lines +
                   "checkpoint: {dir: " + (dir / "ckpt") + ", every: 1, keep: 1}\n"
                   "log: {dir: " + (dir / "run") + ", every: 1}\n");
  }
  std::vector<std::string> env() const { return {tag.env(), "DTRAIN_NO_REBUILD=1"}; }
  std::vector<std::string> args(const std::vector<std::string>& sets) const {
    std::vector<std::string> a = {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--set",
                                  "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())};
    for (const auto& s : sets) a.insert(a.end(), {"--set", s});
    return a;
  }
  std::pair<int, std::string> launch(const std::vector<std::string>& sets, const std::string& name) {
    return dtrain::testing::run_command(args(sets), dir / (name + ".out"), 120, env());
  }
  std::string metrics() const { return dir / "run/metrics.jsonl"; }
};

// The step_<N> directories of a checkpoint root, by name.
std::vector<std::string> step_dirs(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) out.push_back(e.path().filename());
  return out;
}

std::string bytes_data(const TempDir& dir) {
  write_file(dir / "text.txt",
             dtrain::testing::word_salad(16 * 1024, {"the ", "loss ", "is ", "not ", "a ", "number\n"}));
  return "data: {path: " + (dir / "text.txt") + ", format: bytes}\n";
}

}  // namespace

TEST_CASE("a diverging run stops naming step, value and fix; keeps its last finite checkpoint; valid JSON") {
  TempDir data;
  Run r(bytes_data(data));
  // lr 1e4 without clipping or warm-up: finite steps first, then NaN, on
  // every run (the data, the init and the order are fixed by the seed).
  auto [code, out] = r.launch({"train.lr=1.0e4", "train.grad_clip=0", "train.warmup_steps=0", "train.steps=12"},
                              "diverge");
  std::vector<std::string> bad;
  const auto lines = metrics_lines(r.metrics(), &bad);
  CHECK_MESSAGE(bad.empty(), bad.size() << " metrics.jsonl line(s) are not JSON, the first: "
                                        << (bad.empty() ? "" : bad.front()));
  int first_nonfinite = 0, last_step = 0;
  for (const auto& j : lines) {
    last_step = j["step"].get<int>();
    if (j.value("nonfinite", false) && first_nonfinite == 0) {
      first_nonfinite = last_step;
      CHECK((j["loss"].is_null() || j["grad_norm"].is_null()));
    }
  }
  MESSAGE("exit " << code << "; first non-finite step " << first_nonfinite << ", last logged step " << last_step
                  << ", latest = " << dtrain::testing::read_latest(r.dir / "ckpt"));
  CHECK_MESSAGE(code == 2, out);
  REQUIRE_MESSAGE(first_nonfinite >= 2, out);  // at least one finite step to keep
  // Stopped after train.nonfinite_patience = 3 non-finite steps in a row.
  CHECK(last_step == first_nonfinite + 2);
  CHECK(has(out, "training diverged: step " + std::to_string(last_step) + " has loss "));
  CHECK(has(out, "lower train.lr (now 10000), clip gradients with train.grad_clip (now 0, off; e.g. 1.0)"));
  CHECK_FALSE(has(out, "restarting the workers"));
  // keep 1: the one checkpoint left is that of the last finite step, and it is finite.
  const std::string last_finite = "step_" + std::to_string(first_nonfinite - 1);
  CHECK(dtrain::testing::read_latest(r.dir / "ckpt") == last_finite);
  CHECK(step_dirs(r.dir / "ckpt") == std::vector<std::string>{last_finite});
  size_t values = 0, nonfinite = 0;
  for (const auto& [name, v] : dtrain::testing::read_safetensors_f32(r.dir / ("ckpt/" + last_finite + "/rank_0.safetensors")))
    for (float x : v) ++values, nonfinite += !std::isfinite(x);
  MESSAGE(last_finite << "/rank_0.safetensors: " << nonfinite << " of " << values << " F32 values non-finite");
  CHECK(values > 0);
  CHECK(nonfinite == 0);
}

TEST_CASE("train.nonfinite skip_step: a NaN step on one rank is skipped by both, and training goes on") {
  TempDir data;
  Run r(bytes_data(data));
  auto [code, out] = r.launch({"train.nonfinite=skip_step", "train.steps=6", "fault.kind=nan_grad", "fault.rank=1",
                               "fault.step=3"},
                              "skip");
  CHECK_MESSAGE(code == 0, out);
  std::vector<std::string> bad;
  const auto lines = metrics_lines(r.metrics(), &bad);
  CHECK(bad.empty());
  std::vector<int> steps, flagged;
  for (const auto& j : lines) {
    steps.push_back(j["step"].get<int>());
    if (j.value("nonfinite", false)) {
      flagged.push_back(j["step"].get<int>());
      CHECK(j["grad_norm"].is_null());
      CHECK(std::isfinite(j["loss"].get<double>()));  // the forward was fine; the gradients were not
    }
  }
  CHECK(steps == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(flagged == std::vector<int>{3});
  CHECK(has(out, "step 3/6: loss "));
  CHECK(has(out, "gradient norm nan: not finite; every rank skips this step's update"));
  CHECK(has(out, "checkpoint of step 3 not written: the step was not finite"));
  CHECK(dtrain::testing::read_latest(r.dir / "ckpt") == "step_6");
  size_t nonfinite = 0;
  for (const auto& [name, v] : dtrain::testing::read_safetensors_f32(r.dir / "ckpt/step_6/rank_0.safetensors"))
    for (float x : v) nonfinite += !std::isfinite(x);
  CHECK(nonfinite == 0);
}

TEST_CASE("train.nonfinite skip_step on a diverged run: trains to the end, the final save is left out") {
  TempDir data;
  Run r(bytes_data(data));
  auto [code, out] = r.launch({"train.lr=1.0e4", "train.grad_clip=0", "train.warmup_steps=0", "train.steps=6",
                               "train.nonfinite=skip_step"},
                              "skip_diverged");
  CHECK_MESSAGE(code == 0, out);
  std::vector<std::string> bad;
  int first_nonfinite = 0, last_step = 0;
  for (const auto& j : metrics_lines(r.metrics(), &bad)) {
    last_step = j["step"].get<int>();
    if (j.value("nonfinite", false) && first_nonfinite == 0) first_nonfinite = last_step;
  }
  MESSAGE("first non-finite step " << first_nonfinite << ", latest = " << dtrain::testing::read_latest(r.dir / "ckpt"));
  CHECK(bad.empty());
  CHECK(last_step == 6);
  REQUIRE(first_nonfinite >= 2);
  CHECK(has(out, "checkpoint of step 6 not written: the step was not finite"));
  CHECK(dtrain::testing::read_latest(r.dir / "ckpt") == "step_" + std::to_string(first_nonfinite - 1));
}

TEST_CASE("a tokens-u16 file truncated mid-run: a config error naming the file, not restarted") {
  TempDir data;
  // 8192 tokens below the vocabulary: 511 samples of seq_len 16.
  std::string tokens;
  for (unsigned char c : dtrain::testing::word_salad(8192, {"shrinking ", "under ", "the ", "run\n"}))
    tokens += std::string{char(c), '\0'};
  write_file(data / "tokens.u16", tokens);
  const std::string path = data / "tokens.u16";
  Run r("data: {path: " + path + ", format: tokens-u16}\n");
  // Rank 0 slow from step 2 on: the run is still training when the test
  // truncates the file after seeing step 3 logged.
  Child dtrain(r.args({"train.steps=40", "fault.kind=slow", "fault.rank=0", "fault.step=2",
                       "fault.ms=300"}),
               r.dir / "truncate.out", r.env());
  REQUIRE_MESSAGE(wait_until([&] { return metrics_lines(r.metrics(), nullptr).size() >= 3; }, 60), dtrain.output());
  fs::resize_file(path, tokens.size() / 2);
  REQUIRE_MESSAGE(dtrain.wait(60), dtrain.output());
  const std::string out = dtrain.output();
  const auto lines = metrics_lines(r.metrics(), nullptr);
  MESSAGE("exit " << dtrain.exit_code() << " after " << lines.size() << " logged steps");
  CHECK_MESSAGE(dtrain.exit_code() == 2, out);
  CHECK(has(out, "data.path = '" + path + "' changed while training: size 16384 -> 8192 bytes"));
  CHECK(has(out, "not restarting: rank "));
  CHECK_FALSE(has(out, "restarting the workers"));
  CHECK_FALSE(has(read_file(r.dir / "run/rank_0.log"), "restart 1"));
  CHECK(lines.size() < 40);
}
