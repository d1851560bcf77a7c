// `dtrain plan --format json`'s "params" for model.kind llama against an
// independent count: Hugging Face's LlamaForCausalLM / MixtralForCausalLM
// built from the same architecture on the meta device
// (tests/support/hf_param_count.py, the venv's transformers, offline),
// summing every parameter's numel. Tiny specs (GQA, a tied head, a
// Mixtral-style MoE) and the three real-size configs (Llama 3 8B and 70B,
// Mixtral 8x7B), whose published counts are also checked exactly; and
// `plan --suggest` on those configs: fitting meshes best first, and a clear
// refusal (exit 2) when none fits the budget. No worker starts.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/child.h"

namespace {

using namespace dtrain::testing;

struct Case {
  std::string name;
  std::string spec;                // configs/NAME.yaml, or "" for the tiny spec below
  std::vector<std::string> sets;   // over the tiny spec
  std::string hf;                  // hf_param_count.py's architecture
  double published = 0;            // the model card's count (0: none)
};

const char* kTiny =
    "job: {name: tiny-llama, seed: 1}\n"
    "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
    "parallel: {dp: 1}\n"
    "model: {kind: llama, vocab: 256, layers: 3, d_model: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 32}\n"
    "train: {steps: 1, micro_batch: 2, precision: fp32}\n"
    "data: {path: \"\", format: synthetic}\n"
    "entrypoint: builtin\n";

const std::vector<Case> kCases = {
    {"tiny gqa", "", {}, "kind:llama,vocab:256,d_model:64,layers:3,heads:4,kv_heads:2,ffn:96,tie:0", 0},
    {"tiny tied", "", {"model.tie_embeddings=true"},
     "kind:llama,vocab:256,d_model:64,layers:3,heads:4,kv_heads:2,ffn:96,tie:1", 0},
    {"tiny moe",
     "",
     {"model.layers=2", "model.moe.experts=4", "model.moe.top_k=2", "model.moe.d_ff=80"},
     "kind:mixtral,vocab:256,d_model:64,layers:2,heads:4,kv_heads:2,ffn:80,experts:4,top_k:2",
     0},
    {"llama3-8b", "configs/llama3-8b.yaml", {},
     "kind:llama,vocab:128256,d_model:4096,layers:32,heads:32,kv_heads:8,ffn:14336,tie:0", 8030261248.0},
    {"llama3-70b", "configs/llama3-70b.yaml", {},
     "kind:llama,vocab:128256,d_model:8192,layers:80,heads:64,kv_heads:8,ffn:28672,tie:0", 70553706496.0},
    {"mixtral-8x7b", "configs/mixtral-8x7b.yaml", {},
     "kind:mixtral,vocab:32000,d_model:4096,layers:32,heads:32,kv_heads:8,ffn:14336,experts:8,top_k:2",
     46702792704.0},
};

// name -> params, from one run of the Python reference (one import of transformers).
std::map<std::string, double> hf_counts(const TempDir& dir) {
  const std::string python = dtrain::testing::python();
  REQUIRE_MESSAGE(!python.empty(), "no Python with torch was found at configure time: run scripts/install-deps");
  std::vector<std::string> argv = {python, source_dir() + "/tests/support/hf_param_count.py"};
  for (size_t i = 0; i < kCases.size(); ++i) argv.push_back("c" + std::to_string(i) + "=" + kCases[i].hf);
  auto [code, out] = run_command(argv, dir / "hf.log", 120, {"HF_HUB_OFFLINE=1"});
  INFO(out);
  REQUIRE(code == 0);
  std::map<std::string, double> counts;
  std::ifstream in(dir / "hf.log");
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') {
      const auto j = nlohmann::json::parse(line);
      counts[j["name"].get<std::string>()] = j["params"].get<double>();
    }
  REQUIRE(counts.size() == kCases.size());
  return counts;
}

nlohmann::json plan_json(const TempDir& dir, const Case& c, const std::string& tiny) {
  std::vector<std::string> argv = {dtrain_bin(), "plan", c.spec.empty() ? tiny : source_dir() + "/" + c.spec,
                                   "--format", "json", "--no-probe"};
  for (const auto& s : c.sets) argv.insert(argv.end(), {"--set", s});
  auto [code, out] = run_command(argv, dir / "plan.log", 60);
  INFO(c.name << ": " << out);
  REQUIRE(code == 0);
  return nlohmann::json::parse(out);
}

}  // namespace

TEST_CASE("llama plan: params equal transformers' count (tiny GQA, tied, MoE; Llama 3 8B/70B, Mixtral 8x7B)") {
  TempDir dir;
  const std::string tiny = dir / "tiny.yaml";
  std::ofstream(tiny) << kTiny;
  const std::map<std::string, double> hf = hf_counts(dir);
  for (size_t i = 0; i < kCases.size(); ++i) {
    const Case& c = kCases[i];
    const nlohmann::json j = plan_json(dir, c, tiny);
    REQUIRE_MESSAGE(j.contains("params"), c.name << ": dtrain plan --format json has no \"params\"");
    const double planned = j["params"].get<double>(), reference = hf.at("c" + std::to_string(i));
    MESSAGE(c.name << ": dtrain plan " << int64_t(planned) << ", transformers " << int64_t(reference)
                   << ", published " << int64_t(c.published) << " (0: none)");
    CHECK(planned == reference);
    if (c.published > 0) CHECK(planned == c.published);
    // A real-size config's largest rank fits its H200 (each rank builds its share only).
    if (!c.spec.empty()) CHECK(j["max_need_bytes"].get<double>() <= 141.0 * (1 << 30));
  }
}

TEST_CASE("plan --suggest --world 64 at 141GiB: meshes that fit, best first (Llama 3 8B, 70B, Mixtral 8x7B); ep for "
          "MoE; none fitting is exit 2") {
  TempDir dir;
  auto suggest = [&](const std::string& config) {
    return run_command({dtrain_bin(), "plan", source_dir() + "/configs/" + config, "--no-probe", "--suggest",
                        "--world", "64", "--memory-per-rank", "141GiB"},
                       dir / "suggest.log", 60);
  };
  // Mixtral's experts fit because a rank builds its E / ep of them only.
  for (const std::string config : {"llama3-8b.yaml", "llama3-70b.yaml", "mixtral-8x7b.yaml"}) {
    auto [code, out] = suggest(config);
    INFO(out);
    REQUIRE(code == 0);
    const size_t at = out.find("layouts of 64 ranks that fit in 141.00 GiB per rank");
    REQUIRE(at != std::string::npos);
    MESSAGE(config << ":\n" << out.substr(at, out.find("\n  4.", at) - at));
    // Every listed need within the budget; the rows ranked by step time.
    std::istringstream rows(out.substr(at));
    double last = 0;
    int listed = 0;
    for (std::string line; std::getline(rows, line);) {
      const size_t need = line.find(" need "), step = line.find(" step ");
      if (need == std::string::npos || step == std::string::npos) continue;
      ++listed;
      const double gib = std::strtod(line.c_str() + need + 6, nullptr);
      const double seconds = std::strtod(line.c_str() + step + 6, nullptr);
      CHECK(line.find("GiB", need) != std::string::npos);
      CHECK(gib <= 141.0);
      CHECK(seconds >= last);
      last = seconds;
    }
    CHECK(listed >= 3);
  }
  // A MoE model's meshes also spread its experts: ep 1, 2 and 4 over configs/moe.yaml's 4 ranks.
  {
    auto [code, out] = run_command({dtrain_bin(), "plan", source_dir() + "/configs/moe.yaml", "--no-probe", "--suggest",
                                    "--world", "4"},
                                   dir / "moe.log", 60);
    INFO(out);
    REQUIRE(code == 0);
    for (const std::string ep : {" ep 1 ", " ep 2 ", " ep 4 "}) CHECK(out.find(ep) != std::string::npos);
  }
  // None fits a budget below Mixtral's smallest need: exit 2 with it.
  auto [code, out] = run_command({dtrain_bin(), "plan", source_dir() + "/configs/mixtral-8x7b.yaml", "--no-probe",
                                  "--suggest", "--world", "64", "--memory-per-rank", "20GiB"},
                                 dir / "suggest.log", 60);
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("no layout of") != std::string::npos);
  CHECK(out.find("the smallest predicted need is") != std::string::npos);
}
