// `dtrain plan` against the engine's own measurements: for 16 layouts (dp 1
// and 2, ZeRO 0-3, recompute none/full, seq_len 32 and 512,
// attention naive and tiled, tp 2, pp 2, MoE over ep 2, four llamas) the real run's memory.tsv (every
// rank's param, grad and AdamW bytes from GradSync::memory and the optimizer,
// and its largest step peak: the counting allocator's plus its shared-memory
// buffers') next to the plan's prediction for that rank: static bytes within
// 5%, peak within 20% (the llamas' within 8%); the printed table shows both. Also: a budget below the peak is refused (exit 2)
// by `dtrain plan` and by `dtrain launch` with the table and a change that fits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using namespace dtrain::testing::parity;

struct Bytes {
  double param = 0, grad = 0, optimizer = 0, peak = 0;
  double static_bytes() const { return param + grad + optimizer; }
};

double json_number(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\": ");
  REQUIRE_MESSAGE(at != std::string::npos, key << " missing in " << line);
  return std::strtod(line.c_str() + at + key.size() + 4, nullptr);
}

// Per rank, from `dtrain plan --format json`.
std::vector<Bytes> predicted(const std::vector<std::string>& sets, const std::string& name) {
  auto& p = Parity::get();
  std::vector<std::string> argv = {dtrain_bin(), "plan", p.dir / "spec.yaml", "--format", "json", "--no-probe"};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  auto [code, out] = run_command(argv, p.dir / (name + "_plan.log"), 60);
  INFO(out);
  REQUIRE(code == 0);
  std::vector<Bytes> ranks;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.find("{\"rank\": ") == std::string::npos) continue;
    ranks.push_back({json_number(line, "param_bytes"), json_number(line, "grad_bytes"),
                     json_number(line, "optimizer_bytes"), json_number(line, "peak_bytes")});
  }
  return ranks;
}

// Per rank, from the run's memory.tsv.
std::vector<Bytes> measured(const std::vector<std::string>& sets, const std::string& name) {
  auto [code, out] = launch_raw(name, with(sets, {"checkpoint.dir=\"\""}));
  INFO(out);
  REQUIRE(code == 0);
  std::ifstream in(Parity::get().dir / name + "/memory.tsv");
  std::string header;
  std::getline(in, header);
  std::vector<Bytes> ranks;
  double rank, p, g, o, peak, rss;
  while (in >> rank >> p >> g >> o >> peak >> rss) ranks.push_back({p, g, o, peak});
  return ranks;
}

}  // namespace

TEST_CASE("dtrain plan predicts the engine's measured bytes: static within 5%, peak within 20%, 16 layouts") {
  const std::vector<std::string> common = {"model.dropout=0.1", "train.steps=3", "train.warmup_steps=1",
                                           "log.every=1"};
  const std::vector<std::string> seq512 = {"model.seq_len=512", "train.micro_batch=2"};
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"one_process", {}},
      {"dp2_ddp", ranks(2, 4)},
      {"dp2_zero1", with(ranks(2, 4), {"parallel.zero=1"})},
      {"dp2_zero2", with(ranks(2, 4), {"parallel.zero=2"})},
      {"dp2_zero3", with(ranks(2, 4), {"parallel.zero=3"})},  // shared parameters (one node)
      {"dp2_zero3_gathered", with(ranks(2, 4), {"parallel.zero=3", "parallel.fsdp.shared_params=false"})},
      {"recompute_full", {"train.recompute=full"}},
      {"seq512", seq512},
      {"seq512_tiled", with(seq512, {"model.attention=tiled"})},
      {"tp2_sp", {"cluster.procs_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2_1f1b", {"cluster.procs_per_node=2", "parallel.pp=2", "train.micro_batch=2", "train.grad_accum=4"}},
      {"dp2_moe_ep2", with(ranks(2, 4), {"model.moe.experts=16", "model.moe.top_k=2", "parallel.ep=2"})},
      {"llama_seq512", with(seq512, {"model.kind=llama"})},  // the fused RMSNorm and SwiGLU's saved tensors
      {"llama_dp2_zero3", with(ranks(2, 4), {"model.kind=llama", "parallel.zero=3"})},
      {"llama_tp2_sp", {"model.kind=llama", "cluster.procs_per_node=2", "parallel.tp=2",
                        "parallel.sequence_parallel=true"}},
      // Wider, tiled: the norms' and the MLP's saved tensors most of the peak.
      {"llama_d128_tiled", {"model.kind=llama", "model.d_model=128", "model.heads=4", "model.seq_len=128",
                            "model.attention=tiled", "train.micro_batch=4"}},
  };
  double worst_static = 0, worst_peak = 0;
  std::string table = "layout               rank  static_pred  static_meas   diff   peak_pred  peak_meas   diff\n";
  for (const auto& [name, sets] : layouts) {
    const auto all = with(common, sets);
    const std::vector<Bytes> want = predicted(all, "plan_" + name), got = measured(all, "plan_" + name);
    REQUIRE(want.size() == got.size());
    REQUIRE(!got.empty());
    for (size_t r = 0; r < got.size(); ++r) {
      const double ds = want[r].static_bytes() / got[r].static_bytes() - 1, dp = want[r].peak / got[r].peak - 1;
      char line[200];
      std::snprintf(line, sizeof line, "%-20s %4zu %12.0f %12.0f %+6.1f%% %11.0f %10.0f %+6.1f%%\n", name.c_str(), r,
                    want[r].static_bytes(), got[r].static_bytes(), 100 * ds, want[r].peak, got[r].peak, 100 * dp);
      table += line;
      worst_static = std::max(worst_static, std::fabs(ds));
      worst_peak = std::max(worst_peak, std::fabs(dp));
      CHECK(std::fabs(ds) <= 0.05);
      CHECK(std::fabs(dp) <= 0.20);
      // The llamas within 8%: the fused RMSNorm and SwiGLU save less than
      // ATen's compositions (planned as those: +12..19% here).
      if (name.starts_with("llama")) CHECK(std::fabs(dp) <= 0.08);
    }
  }
  MESSAGE("predicted vs measured bytes per rank:\n" << table << "worst static diff " << 100 * worst_static
                                                    << "% (tol 5%), worst peak diff " << 100 * worst_peak
                                                    << "% (tol 20%)");
}

TEST_CASE("a memory budget below the predicted peak is refused with the table and a change that fits") {
  auto& p = Parity::get();
  const std::vector<std::string> sets = {"--set", "model.seq_len=512", "--set", "train.micro_batch=2"};
  std::vector<std::string> argv = {dtrain_bin(), "plan", p.dir / "spec.yaml", "--memory-per-rank", "12MiB", "--no-probe"};
  argv.insert(argv.end(), sets.begin(), sets.end());
  auto [code, out] = run_command(argv, p.dir / "budget_plan.log", 60);
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("cluster.memory_per_rank = 12.00 MiB is below the predicted peak") != std::string::npos);
  CHECK(out.find("activations") != std::string::npos);  // the table
  CHECK(out.find("the cheapest change that fits: --set model.attention=tiled") != std::string::npos);
  // The same budget in the spec refuses `dtrain launch` before any worker starts.
  auto [lcode, lout] = launch_raw("budget_launch", {"model.seq_len=512", "train.micro_batch=2",
                                                    "cluster.memory_per_rank=12MiB"});
  INFO(lout);
  CHECK(lcode == 2);
  CHECK(lout.find("is below the predicted peak") != std::string::npos);
  CHECK(lout.find("[rank") == std::string::npos);  // no worker logged anything
}
