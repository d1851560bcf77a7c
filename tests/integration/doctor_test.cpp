// `dtrain doctor` and MFU with the real binaries: the JSON document's schema
// and its workers-over-cores warning; MKL really forced onto its compatible
// code path (MKL_CBWR=COMPATIBLE) is seen and warned about; `dtrain launch`
// prints the summary, and metrics.jsonl's mfu equals PaLM's FLOP count over
// the logged step time and peak, the sum of the 2 ranks' rates the start-up
// line gathers (a tiny model); with log.live_peak every logged record also
// has peak_flops_live, the ranks' rate measured beside that interval's steps,
// and mfu_live against it, and the losses are those of the run without it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/skip.h"
#include "tests/support/train_run.h"

namespace {

using dtrain::testing::TempDir;
using json = nlohmann::json;

json doctor_json(const TempDir& dir, const std::string& name, std::vector<std::string> args,
                 const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), {dtrain::testing::dtrain_bin(), "doctor", "--format", "json", "--seconds", "0.1"});
  auto [code, out] = dtrain::testing::run_command(args, dir / (name + ".log"), 60, env);
  INFO(out);
  REQUIRE(code == 0);
  return json::parse(out.substr(out.find('{'), out.rfind('}') - out.find('{') + 1));
}

bool has_warning(const json& j, const std::string& code) {
  for (const auto& w : j["warnings"])
    if (w["code"] == code) return true;
  return false;
}

}  // namespace

TEST_CASE("doctor --format json: the schema, and more workers than cores") {
  TempDir dir;
  json j = doctor_json(dir, "doctor", {"-n", "4096"});
  CHECK(j["schema"] == "dtrain.doctor/1");
  const json& h = j["host"];
  CHECK(h["cores"].get<int>() >= 1);
  CHECK(h["numa_nodes"].get<int>() >= 1);
  for (const char* f : {"avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    CHECK_MESSAGE(h["flags"][f].is_boolean(), f);
  bool loopback = false;
  for (const auto& n : h["interfaces"]) loopback = loopback || (n["loopback"] == true && n["address"] == "127.0.0.1");
  CHECK(loopback);
  const json& e = j["engine"];
  REQUIRE(e["available"] == true);
  CHECK(e["torch_version"].get<std::string>().rfind("2.", 0) == 0);
  const std::string blas = e["blas"]["name"];
  CHECK((blas == "mkl" || blas == "openblas"));
  CHECK(!e["blas"]["core"].get<std::string>().empty());
  CHECK(e["blas_check_error"] == "");
  CHECK(e["blas_check_max_rel_err"].get<double>() <= 1e-5);
  MESSAGE("sgemm fp32 " << e["sgemm_fp32_gflops"] << " bf16 " << e["sgemm_bf16_gflops"] << " GFLOP/s; "
          << j["summary"]);
  CHECK(e["sgemm_fp32_gflops"].get<double>() > 0);
  CHECK(e["sgemm_bf16_gflops"].get<double>() > 0);
  CHECK(e["gpus"].is_array());
  CHECK(j["workers"] == 4096);
  REQUIRE(has_warning(j, "workers_over_cores"));
  const std::string want = "4096 workers on " + std::to_string(h["cores"].get<int>()) + " cores";
  bool figures = false;
  for (const auto& w : j["warnings"]) figures = figures || w["message"].get<std::string>().find(want) == 0;
  CHECK(figures);
}

TEST_CASE("doctor: MKL forced onto its compatible code path is warned about") {
  TempDir dir;
  json plain = doctor_json(dir, "plain", {});
  if (plain["engine"]["blas"]["name"] != "mkl") {
    DTRAIN_SKIP(blas, "LibTorch's BLAS here is " << plain["engine"]["blas"]["name"] << ", not MKL");
  }
  CHECK_FALSE(has_warning(plain, "blas_code_path"));
  json forced = doctor_json(dir, "forced", {}, {"MKL_CBWR=COMPATIBLE"});
  CHECK(forced["engine"]["blas"]["mkl_cbwr"] == 3);
  CHECK(forced["engine"]["blas"]["overrides"]["MKL_CBWR"] == "COMPATIBLE");
  MESSAGE("sgemm fp32 auto " << plain["engine"]["sgemm_fp32_gflops"] << " vs COMPATIBLE "
          << forced["engine"]["sgemm_fp32_gflops"] << " GFLOP/s");
  CHECK(has_warning(forced, "blas_code_path"));
}

TEST_CASE("launch: the doctor lines at start, and mfu in metrics.jsonl is PaLM's count / time / peak over 2 ranks") {
  TempDir dir;
  dtrain::testing::TagGuard tag;
  const int V = 256, L = 2, C = 32, T = 32, B = 4, steps = 4;
  dtrain::testing::write_file(dir / "text.txt", dtrain::testing::word_salad(16 * 1024, {"model ", "flops\n"}));
  dtrain::testing::write_file(
      dir / "spec.yaml",
      "job: {name: mfu, seed: 3}\n"
      "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: gloo}\n"
      "parallel: {dp: 2}\n"
      "model: {kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}\n"
      "train: {steps: 4, micro_batch: 4, lr: 3.0e-3, warmup_steps: 2}\n"
      "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
      "log: {dir: " + (dir / "run") + ", every: 1}\n"
      "entrypoint: builtin\n");
  auto [code, out] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--set",
       "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(dtrain::testing::free_port())},
      dir / "launch.log", 120, {tag.env()});
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("doctor: ") != std::string::npos);                  // the launcher's summary
  CHECK(out.find("start-up check max rel err") != std::string::npos);  // rank 0's BLAS line
  CHECK(out.find("| MFU ") != std::string::npos);                     // the progress line
  // The ranks' rates, gathered: with 2 ranks min and max are the two, and
  // MFU's peak is their sum times each rank's share of the cores.
  double lo = 0, med = 0, hi = 0, share = 0;
  {
    std::smatch m;
    const std::regex spread(R"(the ranks' matmul rates: min ([0-9.]+) \(rank [01]\), median ([0-9.]+), max ([0-9.]+) GFLOP/s)");
    REQUIRE(std::regex_search(out, m, spread));
    lo = std::stod(m[1]), med = std::stod(m[2]), hi = std::stod(m[3]);
    const std::regex cores(R"(over 2 ranks \(([0-9]+) cores here, 2 local ranks\))");
    REQUIRE(std::regex_search(out, m, cores));
    share = std::min(1.0, std::stod(m[1]) / 2.0);
  }
  CHECK(lo > 0);
  CHECK(lo <= med);
  CHECK(med <= hi);
  CHECK(med == doctest::Approx((lo + hi) / 2).epsilon(1e-3));
  // engine/model/gpt.cpp's parameters: wte, wpe, per block 12C^2 + 13C, final LayerNorm, head.
  const double params = double(V) * C + double(T) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C + double(V) * C;
  const double tokens = 2.0 * B * T;  // dp 2
  const double flops = 6 * params * tokens + 12.0 * L * C * T * tokens;
  std::ifstream in(dir / "run/metrics.jsonl");
  int lines = 0;
  double last_cpu = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    json m = json::parse(line);
    REQUIRE(m.contains("mfu"));
    // The process's CPU seconds: positive and growing with every step.
    REQUIRE(m.contains("cpu_s"));
    CHECK(m["cpu_s"].get<double>() > last_cpu);
    last_cpu = m["cpu_s"].get<double>();
    CHECK(m["flops_per_step"].get<double>() == doctest::Approx(flops).epsilon(1e-12));
    const double peak = m["peak_flops"];
    REQUIRE(peak > 0);
    // The log prints the rates to 0.1 GFLOP/s.
    CHECK(peak == doctest::Approx((lo + hi) * 1e9 * share).epsilon(2e-3));
    const double want = flops / m["step_time_s"].get<double>() / peak;
    // step_time_s is printed to 6 significant digits: 1e-5 relative covers its rounding.
    CHECK(m["mfu"].get<double>() == doctest::Approx(want).epsilon(1e-5));
    CHECK(m["mfu"].get<double>() > 0);
    CHECK(m["mfu"].get<double>() < 1);
  }
  CHECK(lines == steps);
}

TEST_CASE("launch: log.live_peak measures the peak beside each logged interval's steps, and changes no loss") {
  TempDir dir;
  dtrain::testing::TagGuard tag;
  dtrain::testing::write_file(dir / "text.txt", dtrain::testing::word_salad(16 * 1024, {"live ", "peak\n"}));
  auto spec = [&](const std::string& name, int seed) {
    dtrain::testing::write_file(
        dir / (name + ".yaml"),
        "job: {name: live, seed: " + std::to_string(seed) + "}\n"
        "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: gloo}\n"
        "parallel: {dp: 2}\n"
        "model: {kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.1}\n"
        "train: {steps: 6, micro_batch: 4, lr: 3.0e-3, warmup_steps: 2}\n"
        "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
        "log: {dir: " + (dir / name) + ", every: 2}\n"
        "entrypoint: builtin\n");
    return dir / (name + ".yaml");
  };
  // Each run's metrics.jsonl records, in order.
  auto run = [&](const std::string& name, int seed, bool live) {
    std::vector<std::string> args = {dtrain::testing::dtrain_bin(), "launch", spec(name, seed), "--set",
                                     "cluster.rendezvous.endpoint=127.0.0.1:" +
                                         std::to_string(dtrain::testing::free_port())};
    if (live) args.insert(args.end(), {"--set", "log.live_peak=true"});
    auto [code, out] = dtrain::testing::run_command(args, dir / (name + ".log"), 120, {tag.env()});
    INFO(out);
    REQUIRE(code == 0);
    CHECK((out.find("(live peak ") != std::string::npos) == live);  // the progress line's second MFU
    std::vector<json> recs;
    std::ifstream in(dir / (name + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) recs.push_back(json::parse(line));
    return recs;
  };
  const std::vector<json> off = run("off", 3, false), on = run("on", 3, true), other = run("seed4", 4, false);
  REQUIRE(off.size() == 4);  // steps 1, 2, 4, 6
  REQUIRE(on.size() == off.size());
  REQUIRE(other.size() == off.size());
  int moved = 0;
  for (size_t i = 0; i < off.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(off[i].contains("mfu_live"));
    CHECK_FALSE(off[i].contains("peak_flops_live"));
    // The probe runs between steps on inputs of its own generator: the same
    // losses to the last bit (dropout on); another seed moves them.
    CHECK(on[i]["step"] == off[i]["step"]);
    CHECK(on[i]["loss"].get<double>() == off[i]["loss"].get<double>());
    moved += other[i]["loss"].get<double>() != off[i]["loss"].get<double>();
    // A new figure at every logged step, and mfu_live is the same interval's
    // step time against it.
    REQUIRE(on[i].contains("peak_flops_live"));
    const double live = on[i]["peak_flops_live"];
    CHECK(live > 0);
    const double want = on[i]["flops_per_step"].get<double>() / on[i]["step_time_s"].get<double>() / live;
    CHECK(on[i]["mfu_live"].get<double>() == doctest::Approx(want).epsilon(1e-5));
    // The start-up figure stays the start-up figure; the live one measures
    // the same matmul (a FLOP count off by a factor n would land far outside).
    CHECK(on[i]["peak_flops"].get<double>() == on[0]["peak_flops"].get<double>());
    CHECK(live > 0.25 * on[i]["peak_flops"].get<double>());
    CHECK(live < 4.0 * on[i]["peak_flops"].get<double>());
  }
  CHECK(moved == int(off.size()));
  // Measured beside the steps, not the start-up figure carried along: 4
  // intervals' samples on a shared machine do not all give its value to 17 digits.
  int same = 0;
  for (const auto& r : on) same += r["peak_flops_live"].get<double>() == r["peak_flops"].get<double>();
  CHECK(same < int(on.size()));
}
