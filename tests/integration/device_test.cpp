// Devices and precision through the real `dtrain launch`: cluster.device cuda
// on a machine that shows no GPU (CUDA_VISIBLE_DEVICES="" hides any) and NCCL
// on the CPU are refused before any worker starts; train.precision bf16
// (autocast) trains, and its losses differ from fp32's by bf16's rounding:
// more than fp32 noise (so autocast really ran) and far less than a broken
// model would.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

using dtrain::testing::TempDir;

std::string spec_text(const TempDir& dir) {
  return "job: {name: device, seed: 7}\n"
         "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: auto, grace_s: 1}\n"
         "parallel: {dp: 2}\n"
         "model: {kind: gpt, vocab: 256, layers: 2, d_model: 64, heads: 2, seq_len: 32, dropout: 0.0}\n"
         "train: {steps: 6, micro_batch: 4, lr: 3.0e-3, warmup_steps: 1, precision: fp32}\n"
         "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
         "checkpoint: {dir: \"\"}\n"
         "log: {dir: " + (dir / "logs") + ", every: 1}\n"
         "entrypoint: builtin\n";
}

struct Launch {
  int code = -1;
  std::string output;
};

Launch launch(const TempDir& dir, const std::vector<std::string>& sets,
              const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml"};
  for (auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  auto [code, out] = dtrain::testing::run_command(argv, dir / "launch.log", 240, env);
  return {code, out};
}

std::map<int, double> losses(const std::string& metrics_path) {
  std::map<int, double> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto s = line.find("\"step\":"), l = line.find("\"loss\":");
    if (s == std::string::npos || l == std::string::npos) continue;
    out[std::stoi(line.substr(s + 7))] = std::stod(line.substr(l + 7));
  }
  return out;
}

void prepare(const TempDir& dir) {
  dtrain::testing::write_file(dir / "spec.yaml", spec_text(dir));
  dtrain::testing::write_file(
      dir / "text.txt",
      dtrain::testing::word_salad(32 * 1024, {"a ", "device ", "runs ", "the ", "same ", "model\n"}));
}

}  // namespace

TEST_CASE("cluster.device cuda without a visible GPU: exit 2 before any worker starts") {
  TempDir dir;
  prepare(dir);
  Launch r = launch(dir, {"cluster.device=cuda"}, {"CUDA_VISIBLE_DEVICES="});
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("cluster.device = cuda") != std::string::npos);
  CHECK(r.output.find("no NVIDIA GPU") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "logs/rank_0.log"));  // no worker ran
}

TEST_CASE("cluster.backend nccl with device cpu: exit 2 naming the field") {
  TempDir dir;
  prepare(dir);
  Launch r = launch(dir, {"cluster.backend=nccl"});
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("cluster.backend") != std::string::npos);
  CHECK(r.output.find("nccl") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "logs/rank_0.log"));
}

TEST_CASE("train.precision bf16 (autocast) on CPU: trains, and differs from fp32 by bf16 rounding") {
  TempDir dir;
  prepare(dir);
  Launch fp32 = launch(dir, {"log.dir=" + (dir / "fp32")});
  REQUIRE_MESSAGE(fp32.code == 0, fp32.output);
  Launch bf16 = launch(dir, {"log.dir=" + (dir / "bf16"), "train.precision=bf16"});
  REQUIRE_MESSAGE(bf16.code == 0, bf16.output);
  auto a = losses(dir / "fp32/metrics.jsonl"), b = losses(dir / "bf16/metrics.jsonl");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  double max_rel = 0;
  for (auto& [step, loss] : a) max_rel = std::max(max_rel, std::fabs(b.at(step) - loss) / loss);
  MESSAGE("bf16 vs fp32 over 6 steps: max loss rel diff " << max_rel
          << " (must be > 1e-5, above fp32 noise, and < 5e-2); loss " << b.begin()->second
          << " -> " << b.rbegin()->second);
  CHECK(max_rel > 1e-5);
  CHECK(max_rel < 5e-2);
  CHECK(b.rbegin()->second < b.begin()->second);  // it learns
  CHECK(bf16.output.find("bf16") != std::string::npos);

  // The counting allocator's step peak holds at least the persistent state
  // (parameters, gradients, AdamW moments are all alive during a step) plus
  // activations, and stays below the process's resident memory.
  auto field = [](const std::string& line, const std::string& key) {
    auto at = line.find("\"" + key + "\": ");
    REQUIRE(at != std::string::npos);
    return std::stoll(line.substr(at + key.size() + 4));
  };
  std::string last, line;
  std::ifstream in(dir / "fp32/metrics.jsonl");
  while (std::getline(in, line)) last = line;
  const long long persistent =
      field(last, "param_bytes") + field(last, "grad_bytes") + field(last, "optimizer_bytes");
  const long long peak = field(last, "peak_bytes"), rss = field(last, "rss_bytes");
  MESSAGE("step peak " << peak << " B: persistent " << persistent << " B + "
                       << peak - persistent << " B transient; rss " << rss << " B");
  CHECK(peak > persistent);
  CHECK(peak < rss);
}
