// Goodput and `dtrain status` through the real `dtrain launch` (tiny GPT of
// the parity fixture): goodput.json after a run whose worker is killed once
// (redone steps and restart time, causes summing to the wall) and continued
// by a second launch into the same log.dir (a second segment); `dtrain status`
// on a running 2-node job on loopback (2 nodes, their ranks, steps that
// advance), with a wrong token, and on the finished job: one line each.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using parity::launch_raw;
using parity::Parity;
using json = nlohmann::json;

const char* kCauses[] = {"productive", "redone", "checkpoint", "restart", "startup", "eval", "idle"};

json read_json(const std::string& path) {
  auto j = json::parse(read_file(path), nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), path << ":\n" << read_file(path));
  return j;
}

// The causes of one "seconds" object, summed.
double causes_sum(const json& seconds) {
  double sum = 0;
  for (const char* c : kCauses) sum += seconds.at(c).get<double>();
  return sum;
}

// Polls until pred() (or the deadline); returns pred().
template <typename Pred>
bool poll_until(double timeout_s, Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!pred() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return pred();
}

size_t lines(const std::string& text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n' || i + 1 == text.size()) ++n;
  return n;
}

}  // namespace

TEST_CASE("goodput.json: a killed worker's lost steps are redone, the restart is counted, causes sum to the wall") {
  // 20 steps, a checkpoint every 10; rank 0 is killed after step 14, so the
  // restart resumes at step 10 and computes 11..14 again.
  auto [code, out] = launch_raw("gp", {"checkpoint.every=10", "cluster.max_restarts=1", "fault.kind=kill_after_step",
                                       "fault.step=14"});
  INFO(out);
  REQUIRE(code == 0);
  const std::string run = Parity::get().dir / "gp";
  json g = read_json(run + "/goodput.json");
  MESSAGE("goodput.json: " << g.dump());
  const double wall = g.at("wall_s").get<double>();
  const json& s = g.at("seconds");
  const double sum = causes_sum(s);
  MESSAGE("wall " << wall << " s, causes sum " << sum << " s, difference " << std::fabs(sum - wall) / wall * 100
                  << "% (tolerance 1%)");
  CHECK(wall > 0);
  CHECK(std::fabs(sum - wall) <= 0.01 * wall);
  CHECK(s.at("productive").get<double>() > 0);
  CHECK(s.at("redone").get<double>() > 0);
  CHECK(s.at("restart").get<double>() > 0);
  CHECK(s.at("startup").get<double>() > 0);
  CHECK(s.at("checkpoint").get<double>() > 0);
  // Redone: 4 of 24 computed steps, by the trace's own step-time sums.
  const double steps_s = s.at("productive").get<double>() + s.at("redone").get<double>();
  MESSAGE("redone share " << s.at("redone").get<double>() / steps_s << " (4 of 24 steps = 0.167)");
  CHECK(s.at("redone").get<double>() / steps_s == doctest::Approx(4.0 / 24.0).epsilon(0.5));
  CHECK(g.at("goodput").get<double>() == doctest::Approx(s.at("productive").get<double>() / wall));
  REQUIRE(g.at("segments").size() == 1);
  CHECK(g["segments"][0].at("attempts") == 2);
  CHECK(g["segments"][0].at("last_step") == 20);
  CHECK(out.find("goodput ") != std::string::npos);  // the console table
  CHECK(out.find("redone") != std::string::npos);
  // The same figures in TensorBoard (tb/goodput), as its own reader sees them:
  // the last value of each scalar is the final goodput.json's.
  REQUIRE_MESSAGE(!python().empty(), "no Python was found at configure time: run scripts/install-deps");
  auto [pcode, pout] = run_command(
      {python(), "-c",
       "import sys\nfrom tensorboard.backend.event_processing import event_accumulator as ea\n"
       "e = ea.EventAccumulator(sys.argv[1]); e.Reload()\n"
       "print(e.Scalars('goodput')[-1].value, e.Scalars('seconds/redone')[-1].value, e.Scalars('wall_s')[-1].step)",
       run + "/tb/goodput"},
      Parity::get().dir / "gp_tb.log", 120);
  MESSAGE("TensorBoard tb/goodput (goodput, redone, step): " << pout);
  REQUIRE(pcode == 0);
  double tb_goodput = 0, tb_redone = 0;
  long tb_step = 0;
  REQUIRE(std::sscanf(pout.c_str(), "%lf %lf %ld", &tb_goodput, &tb_redone, &tb_step) == 3);
  CHECK(tb_goodput == doctest::Approx(g.at("goodput").get<double>()).epsilon(1e-6));
  CHECK(tb_redone == doctest::Approx(s.at("redone").get<double>()).epsilon(1e-6));
  CHECK(tb_step == 20);

  // A second launch into the same log.dir resumes from the step-20
  // checkpoint: a second segment, the first one kept as it was. Its steps
  // are slowed (100 ms) so that `dtrain status LOG_DIR` finds it running: a
  // one-machine job, its generated token in a file only its owner reads.
  TagGuard tag;
  std::vector<std::string> argv = {dtrain_bin(), "launch", Parity::get().dir / "spec.yaml"};
  const std::vector<std::string> sets = {"log.dir=" + run,   "checkpoint.dir=" + run + "/ckpt",
                                         "checkpoint.every=10", "train.steps=35",
                                         "fault.kind=slow",     "fault.step=21",
                                         "fault.ms=100",        "cluster.rendezvous.heartbeat_s=0.3"};
  for (const std::string& set : sets) argv.insert(argv.end(), {"--set", set});
  Child second(argv, Parity::get().dir / "gp_second.log", {tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN="});
  json live;
  auto running_step = [&] {
    auto [c, text] = run_command({dtrain_bin(), "status", run, "--format", "json"},
                                 Parity::get().dir / "gp_status.log", 60, {"DTRAIN_TOKEN="});
    if (c != 0) return int64_t(0);
    live = json::parse(text, nullptr, false);
    if (live.is_discarded() || live["nodes"].size() != 1 || live["nodes"][0]["ranks"].size() != 1) return int64_t(0);
    return live["nodes"][0]["ranks"][0].at("step").get<int64_t>();
  };
  REQUIRE_MESSAGE(poll_until(90, [&] { return running_step() > 20 || !second.running(); }), second.output());
  MESSAGE("status LOG_DIR of the running one-machine job: " << live.dump());
  CHECK(running_step() > 20);
  struct stat st {};
  CHECK(::stat((run + "/.dtrain.token").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(second.wait(120));
  const std::string out2 = second.output();
  INFO(out2);
  REQUIRE(second.exit_code() == 0);
  CHECK(!std::filesystem::exists(run + "/.dtrain.token"));  // gone with the job
  json g2 = read_json(run + "/goodput.json");
  REQUIRE(g2.at("segments").size() == 2);
  CHECK(g2["segments"][0].at("seconds") == g["segments"][0].at("seconds"));
  CHECK(g2["segments"][1].at("first_step") == 20);
  CHECK(g2["segments"][1].at("last_step") == 35);
  CHECK(g2["segments"][1]["seconds"].at("redone").get<double>() == 0);
  const double wall2 = g2.at("wall_s").get<double>();
  CHECK(wall2 == doctest::Approx(g2["segments"][0].at("wall_s").get<double>() +
                                 g2["segments"][1].at("wall_s").get<double>()));
  CHECK(std::fabs(causes_sum(g2.at("seconds")) - wall2) <= 0.01 * wall2);
}

TEST_CASE("dtrain status: a running 2-node job's nodes and ranks, advancing; wrong token and finished job: one line") {
  auto& p = Parity::get();
  TagGuard tag;
  const std::string run = p.dir / "status";
  const int port = free_port();
  const std::string rdzv = "127.0.0.1:" + std::to_string(port);
  // Rank 0 sleeps 150 ms in each step: long enough to be seen running.
  std::vector<std::string> sets = {"log.dir=" + run, "cluster.nodes=2", "parallel.dp=2",
                                   "cluster.rendezvous.heartbeat_s=0.3", "train.steps=40",
                                   "fault.kind=slow", "fault.rank=0", "fault.step=1", "fault.ms=150"};
  auto agent = [&](int node) {
    std::vector<std::string> argv = {dtrain_bin(), "launch", p.dir / "spec.yaml", "--node-rank", std::to_string(node),
                                     "--rdzv", rdzv};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    return std::make_unique<Child>(argv, p.dir / ("status_agent" + std::to_string(node) + ".log"),
                                   std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=st-token"});
  };
  auto status = [&](const std::vector<std::string>& args, const std::string& token, const std::string& log) {
    std::vector<std::string> argv = {dtrain_bin(), "status"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, p.dir / log, 60, {"DTRAIN_TOKEN=" + token});
  };
  auto a0 = agent(0);
  REQUIRE_MESSAGE(poll_until(60, [&] { return a0->output().find("listening on port") != std::string::npos; }),
                  a0->output());
  auto a1 = agent(1);

  // Steps of every rank, by node, from one `status --format json`; empty
  // until both nodes report ranks.
  auto steps = [&](json* j) {
    std::vector<int64_t> out;
    auto [code, text] = status({"--rdzv", rdzv, "--format", "json"}, "st-token", "status_json.log");
    if (code != 0) return out;
    *j = json::parse(text, nullptr, false);
    if (j->is_discarded() || j->at("nodes").size() != 2) return std::vector<int64_t>{};
    for (const auto& n : j->at("nodes")) {
      if (n.at("ranks").size() != 1) return std::vector<int64_t>{};
      out.push_back(n["ranks"][0].at("step").get<int64_t>());
    }
    return out;
  };
  json first, later;
  std::vector<int64_t> s1, s2;
  REQUIRE_MESSAGE(poll_until(90, [&] { return (s1 = steps(&first)).size() == 2 && s1[0] > 0 && s1[1] > 0; }),
                  first.dump() << "\n" << a0->output() << a1->output());
  MESSAGE("first: " << first.dump());
  std::set<int> ranks;
  for (const auto& n : first["nodes"]) {
    CHECK(!n.at("address").get<std::string>().empty());
    CHECK(n.contains("hostname"));
    ranks.insert(n["ranks"][0].at("rank").get<int>());
    CHECK(n["ranks"][0].at("tokens_per_s").get<double>() > 0);
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(first.at("round").get<int>() >= 1);
  REQUIRE_MESSAGE(
      poll_until(90, [&] { return (s2 = steps(&later)).size() == 2 && s2[0] > s1[0] && s2[1] > s1[1]; }),
      later.dump());
  MESSAGE("steps advanced: node 0 " << s1[0] << " -> " << s2[0] << ", node 1 " << s1[1] << " -> " << s2[1]);
  auto [tcode, ttext] = status({"--rdzv", rdzv}, "st-token", "status_text.log");
  MESSAGE("text:\n" << ttext);
  CHECK(tcode == 0);

  auto [wcode, wtext] = status({"--rdzv", rdzv}, "not-the-token", "status_wrong.log");
  MESSAGE("wrong token: " << wtext);
  CHECK(wcode != 0);
  CHECK(lines(wtext) == 1);
  CHECK(wtext.find("token") != std::string::npos);
  CHECK(wtext.find("not-the-token") == std::string::npos);
  CHECK(wtext.find("st-token") == std::string::npos);

  REQUIRE(a0->wait(120));
  REQUIRE(a1->wait(120));
  CHECK_MESSAGE(a0->exit_code() == 0, a0->output());
  CHECK_MESSAGE(a1->exit_code() == 0, a1->output());
  auto [fcode, ftext] = status({run}, "st-token", "status_finished.log");
  MESSAGE("finished (LOG_DIR): " << ftext);
  CHECK(fcode != 0);
  CHECK(lines(ftext) == 1);
  auto [rcode, rtext] = status({"--rdzv", rdzv}, "st-token", "status_finished_rdzv.log");
  MESSAGE("finished (--rdzv): " << rtext);
  CHECK(rcode != 0);
  CHECK(lines(rtext) == 1);
}
