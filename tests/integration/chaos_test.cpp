// Faults and their recovery: an automatic resume falls back past a corrupt
// newest checkpoint (naming it) while an explicit resume refuses it; an agent
// started while the job runs (a killed node's replacement) leaves the running
// round's spec alone; a worker stopped before its first collective is named
// as a hang; and a seeded chaos campaign of every fault kind on 3 test hosts
// (bench/chaos/chaos.py) passes all its checks. Campaign cases skip, saying
// why, without namespaces.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/parity.h"
#include "tests/support/skip.h"
#include "tests/support/test_hosts.h"

using dtrain::testing::TestHosts;
namespace parity = dtrain::testing::parity;
namespace fs = std::filesystem;

namespace {

using parity::step_losses;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Polls until pred() or timeout_s; returns pred().
template <typename Pred>
bool wait_until(double timeout_s, Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!pred() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return pred();
}

// The value of `key:` in the block `section:` of a printed spec ("" when absent).
std::string spec_value(const std::string& yaml, const std::string& section, const std::string& key) {
  std::istringstream in(yaml);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ') inside = line == section + ":";
    const std::string head = "  " + key + ": ";
    if (inside && line.rfind(head, 0) == 0) return line.substr(head.size());
  }
  return "";
}

using dtrain::testing::corrupt_step;

}  // namespace

TEST_CASE("a corrupt newest checkpoint: the automatic resume falls back to the newest that verifies; "
          "an explicit resume refuses it; with every step corrupt the job stops after two alike failures") {
  auto& p = parity::Parity::get();
  const std::string run = p.dir / "corrupt_latest";
  // Every run has train.steps 8 (the learning-rate schedule depends on it,
  // and the redone steps must see the same one).
  auto launch = [&](const std::string& name, std::vector<std::string> args = {}, int restarts = 1) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml"};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const std::string& s :
         {"log.dir=" + run, "checkpoint.dir=" + run + "/ckpt", std::string("checkpoint.every=2"),
          std::string("checkpoint.keep=10"), std::string("train.steps=8"),
          "cluster.max_restarts=" + std::to_string(restarts),
          "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(dtrain::testing::free_port())})
      argv.insert(argv.end(), {"--set", s});
    return dtrain::testing::run_command(argv, p.dir / (name + ".log"), 120);
  };
  // The first run dies after step 6 and its checkpoint (no restart).
  auto [code, out] = launch("corrupt_latest_a", {"--set", "fault.kind=kill_after_step", "--set", "fault.step=6"}, 0);
  REQUIRE_MESSAGE(code != 0, out);
  const auto first = step_losses(run + "/metrics.jsonl");
  REQUIRE(first.size() == 6);
  REQUIRE(corrupt_step(run + "/ckpt/step_6") == 1);

  // Explicit: refused, naming the checksum.
  std::tie(code, out) = launch("corrupt_latest_explicit", {"--resume-from", run + "/ckpt/step_6"});
  CHECK_MESSAGE(code != 0, out);
  CHECK_MESSAGE(has(out, "checksum mismatch"), out);
  CHECK_MESSAGE(!has(out, "skipped step_6"), out);
  CHECK_MESSAGE(has(out, "this run was started with --resume-from, so its restarts do not fall back"), out);

  // Automatic (the run dir's `latest`): step_6 is skipped, named, and the
  // run goes on from step_4, redoing 5 and 6 exactly.
  std::tie(code, out) = launch("corrupt_latest_b");
  INFO(out);
  REQUIRE(code == 0);
  CHECK(has(out, "checkpoint: skipped step_6: "));
  CHECK(has(out, "checksum mismatch"));
  CHECK(has(out, "checkpoint: resuming from step_4, the newest step that verifies, instead of `latest` (step_6)"));
  CHECK(has(out, "resuming from step 4 "));
  const auto all = step_losses(run + "/metrics.jsonl");
  REQUIRE(all.size() == 6 + 4);  // 1..6, then 5..8
  double worst = 0;
  for (size_t i = 0; i < 4; ++i) CHECK(all[6 + i].first == 5 + int(i));
  for (size_t i = 0; i < 2; ++i)
    worst = std::max(worst, std::fabs(all[6 + i].second - first[4 + i].second) / std::fabs(first[4 + i].second));
  MESSAGE("fallback to step 4: steps 5-6 redone, max loss rel diff vs their first run " << worst << " (tolerance "
                                                                                        << parity::kLossRelTol << ")");
  CHECK(worst <= parity::kLossRelTol);

  // Every step corrupt: each attempt fails alike before its first step
  // ("no checkpoint in DIR verifies"). The agent stops after the second
  // such failure instead of using all 5 restarts.
  for (const auto& e : fs::directory_iterator(run + "/ckpt"))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) corrupt_step(e.path());
  const std::string before = dtrain::testing::read_file(run + "/rank_0.log");
  std::tie(code, out) = launch("corrupt_every_step", {}, 5);
  const std::string log = dtrain::testing::read_file(run + "/rank_0.log").substr(before.size());
  int starts = 0;
  for (size_t at = log.find(", restart "); at != std::string::npos; at = log.find(", restart ", at + 1)) ++starts;
  MESSAGE("every step corrupt, cluster.max_restarts 5: " << starts << " worker start(s)");
  CHECK(code != 0);
  CHECK(has(out, "no checkpoint in " + run + "/ckpt verifies"));
  CHECK(has(out, "not restarting: rank 0 failed before the first step on the same checkpoint error as the "
                 "previous attempt; retrying cannot help: no checkpoint in "));
  CHECK(starts == 2);
}

TEST_CASE("an agent started while the job runs leaves the running round's spec alone") {
  // A killed node's replacement (or any late node of an elastic job) runs
  // `dtrain launch` while the survivors' round starts its workers. Those
  // workers read log.dir's spec.resolved.yaml (DTRAIN_SPEC) as they start:
  // the round's dp and grad_accum. The replacement must not rewrite it with
  // the job's own numbers (dp at the largest size) before they read it, or
  // they train another global batch (grad_accum for dp 2 with dp 1 here).
  // The workers are shell scripts that hold until the replacement joined.
  dtrain::testing::TempDir dir;
  const std::string run = dir / "run";
  const std::string rdzv = "127.0.0.1:" + std::to_string(dtrain::testing::free_port());
  dtrain::testing::write_file(
      dir / "worker.sh",
      "trap 'stop=1' TERM\n"
      "touch " + dir / "started_w$WORLD_SIZE" + "\n"
      "while [ ! -e " + dir / "go" + " ]; do sleep 0.05; done\n"
      "cp \"$DTRAIN_SPEC\" " + dir / "seen_w${WORLD_SIZE}_r$RANK.yaml" + "\n"
      // The round of one node holds until its agent stops it for the next round.
      "if [ \"$WORLD_SIZE\" = 1 ]; then while [ -z \"$stop\" ]; do sleep 0.05; done; fi\n");
  dtrain::testing::write_file(
      dir / "spec.yaml",
      "job: {name: late_node, seed: 1}\n"
      "cluster: {nodes: \"1:2\", procs_per_node: 1, device: cpu, backend: gloo, grace_s: 30,\n"
      "          rendezvous: {join_timeout_s: 60, last_call_s: 0.5, heartbeat_s: 0.3}}\n"
      "parallel: {dp: auto}\n"
      "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 16}\n"
      "train: {steps: 1, micro_batch: 1, global_batch: 2, grad_accum: auto}\n"
      "data: {format: synthetic}\n"
      "log: {dir: " + run + "}\n"
      "entrypoint: [sh, " + dir / "worker.sh" + "]\n");
  const std::vector<std::string> env = {"DTRAIN_TOKEN=late-node", "DTRAIN_NO_REBUILD=1"};
  auto agent = [&](int node) {
    return std::make_unique<dtrain::testing::Child>(
        std::vector<std::string>{dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--node-rank",
                                 std::to_string(node), "--rdzv", rdzv},
        dir / ("agent" + std::to_string(node) + ".log"), env);
  };
  auto a0 = agent(0);
  // Round 1: node 0 alone (dp 1, grad_accum 2); its worker waits for `go`.
  REQUIRE_MESSAGE(wait_until(60, [&] { return fs::exists(dir / "started_w1") || !a0->running(); }), a0->output());
  REQUIRE_MESSAGE(fs::exists(dir / "started_w1"), a0->output());
  auto a1 = agent(1);
  // The late agent has launched (and joined): round 2 opens for it.
  REQUIRE_MESSAGE(wait_until(60, [&] { return has(a0->output(), "joins (elastic scale-up)") || !a1->running(); }),
                  a0->output() << a1->output());
  dtrain::testing::write_file(dir / "go", "");
  CHECK_MESSAGE(a0->wait(60), a0->output());
  CHECK_MESSAGE(a1->wait(60), a1->output());
  INFO(a0->output() << a1->output());
  CHECK(a0->exit_code() == 0);
  CHECK(a1->exit_code() == 0);
  const std::string seen1 = dtrain::testing::read_file(dir / "seen_w1_r0.yaml");
  MESSAGE("the round of 1 node's worker read parallel.dp " << spec_value(seen1, "parallel", "dp")
                                                           << ", train.grad_accum "
                                                           << spec_value(seen1, "train", "grad_accum"));
  CHECK(spec_value(seen1, "parallel", "dp") == "1");
  CHECK(spec_value(seen1, "train", "grad_accum") == "2");
  for (const char* r : {"0", "1"}) {
    const std::string seen2 = dtrain::testing::read_file(dir / (std::string("seen_w2_r") + r + ".yaml"));
    CHECK(spec_value(seen2, "parallel", "dp") == "2");
    CHECK(spec_value(seen2, "train", "grad_accum") == "1");
  }
}

TEST_CASE("a worker whose DTRAIN_SPEC holds another round's dp stops before any collective") {
  // What the workers of a re-formed round would do with a spec rewritten
  // under them (the case above): train another global batch, silently.
  dtrain::testing::TempDir dir;
  dtrain::testing::write_file(dir / "spec.yaml",
                              "job: {name: other_round, seed: 1}\n"
                              "cluster: {nodes: 3, procs_per_node: 1, device: cpu, backend: gloo}\n"
                              "parallel: {dp: 3}\n"
                              "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 16}\n"
                              "train: {steps: 1, micro_batch: 1}\n"
                              "data: {format: synthetic}\n"
                              "log: {dir: " + dir / "run" + "}\n");
  const std::string worker = fs::path(dtrain::testing::dtrain_bin()).parent_path() / "dtrain-worker";
  auto [code, out] = dtrain::testing::run_command(
      {worker}, dir / "worker.log", 60,
      {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "DTRAIN_SPEC=" + dir / "spec.yaml",
       "DTRAIN_MESH=tp=1,cp=1,dp=2,pp=1,ep=1"});
  INFO(out);
  CHECK(code == 1);
  CHECK(has(out, "DTRAIN_SPEC = " + dir / "spec.yaml" + " has parallel.dp = 3 but this worker's round has dp 2"));
}

TEST_CASE("a worker stopped before its first collective is named as a hang once start-up runs past its bound") {
  // Rank 1's first start stops itself (SIGSTOP) before the engine starts,
  // as a hang injected while the job restarts does: it never reports, and
  // the stall check (every rank started) cannot see it. Start-up is bounded
  // by join_timeout_s (5 s here): the rendezvous names it, the job restarts
  // and finishes.
  dtrain::testing::TempDir dir;
  const std::string worker = fs::path(dtrain::testing::dtrain_bin()).parent_path() / "dtrain-worker";
  dtrain::testing::write_file(dir / "worker.sh", "if [ \"$RANK\" = 1 ] && [ ! -e " + dir / "stopped" + " ]; then\n"
                                                 "  touch " + dir / "stopped" + "; kill -STOP $$\n"
                                                 "fi\n"
                                                 "exec " + worker + "\n");
  dtrain::testing::write_file(
      dir / "spec.yaml",
      "job: {name: stopped_start, seed: 1}\n"
      "cluster: {nodes: 2, procs_per_node: 1, device: cpu, backend: gloo, grace_s: 1, hang_timeout_s: 2,\n"
      "          max_restarts: 1, rendezvous: {join_timeout_s: 5, heartbeat_s: 0.3}}\n"
      "parallel: {dp: 2}\n"
      "model: {kind: gpt, vocab: 256, layers: 1, d_model: 32, heads: 2, seq_len: 16}\n"
      "train: {steps: 2, micro_batch: 1}\n"
      "data: {format: synthetic}\n"
      "log: {dir: " + dir / "run" + "}\n"
      "entrypoint: [sh, " + dir / "worker.sh" + "]\n");
  const std::string rdzv = "127.0.0.1:" + std::to_string(dtrain::testing::free_port());
  auto agent = [&](int node) {
    return std::make_unique<dtrain::testing::Child>(
        std::vector<std::string>{dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--node-rank",
                                 std::to_string(node), "--rdzv", rdzv},
        dir / ("agent" + std::to_string(node) + ".log"),
        std::vector<std::string>{"DTRAIN_TOKEN=stopped-start", "DTRAIN_NO_REBUILD=1"});
  };
  auto a0 = agent(0);
  REQUIRE_MESSAGE(wait_until(60, [&] { return has(a0->output(), "listening on port") || !a0->running(); }),
                  a0->output());
  auto a1 = agent(1);
  // The hang bound is 5 s; 90 s only guard the test itself.
  const bool ended = a0->wait(90) && a1->wait(30);
  INFO(a0->output() << a1->output());
  CHECK(ended);
  CHECK(fs::exists(dir / "stopped"));
  CHECK(has(a0->output(), "hang: rank(s) 1 completed no collective in the "));
  CHECK(has(a0->output(), "rank 1 on node 1 (127.0.0.1"));
  CHECK(has(a0->output(), "no progress reported (stopped or stuck before connecting)"));
  CHECK(has(a0->output(), "training done: 2 steps"));
  CHECK(a0->exit_code() == 0);
  CHECK(a1->exit_code() == 0);
}

TEST_CASE("the chaos replay's segments: the rounds the final checkpoint came from, read from rank_0.log") {
  // A crafted rank_0.log. Round 3 (1 node) falls back to step 10 and saves
  // step 15 again over round 2's; round 4 (2 nodes) resumes from that 15,
  // so its step 15 is round 3's. Round 5 stops before its first step.
  // bench/chaos/chaos.py --replay trains the segments again.
  dtrain::testing::TempDir dir;
  // async: saves logged as checkpoint.async's commits; memory: the resume
  // is from checkpoint.memory's copies (no sampler position logged).
  auto section = [](int round, int world, int resumed, int from, int to, std::vector<int> saved, bool async = false,
                    bool memory = false) {
    const std::string r = "[07:00:00.000][info][rank 0/" + std::to_string(world) + "][worker] ";
    std::string s = "===== dtrain: job 'chaos' run of T (agent pid 1 on vm), round " + std::to_string(round) +
                    ", restart " + std::to_string(round - 1) + ", rank 0 =====\n" + r + "group world\n";
    if (resumed >= 0 && memory)
      s += r + "resuming from step " + std::to_string(resumed) + " (in-memory copies; disk has step 15) in 0.2 s\n";
    else if (resumed >= 0)
      s += r + "resuming from step " + std::to_string(resumed) + " (/c/step_" + std::to_string(resumed) +
           ", sampler at " + std::to_string(12 * resumed) + " samples): loaded 3.4 MB\n";
    for (int step = from; step <= to; ++step) {
      s += r + "step " + std::to_string(step) + "/5000 | loss 1.0 | lr 1e-3\n";
      for (int k : saved)
        if (k == step)
          s += r + "checkpoint /c/step_" + std::to_string(k) +
               (async ? " committed (async): 3.4 MB from rank 0 written in 20 ms, commit 1 ms\n"
                      : " saved: 3.4 MB from rank 0\n");
    }
    return s;
  };
  const std::string head = section(1, 3, -1, 1, 12, {5, 10}) + section(2, 3, 10, 11, 22, {15, 20}) +
                           section(3, 1, 10, 11, 17, {15});
  const std::string tail = section(5, 3, -1, 0, -1, {}) + section(6, 2, 27, 28, 31, {30, 31});
  dtrain::testing::write_file(dir / "rank_0.log", head + section(4, 2, 15, 16, 27, {20, 25, 27}) + tail);
  // The same, with round 4's last "saved" line lost (its agent SIGKILLed).
  dtrain::testing::write_file(dir / "lost_line.log", head + section(4, 2, 15, 16, 27, {20, 25}) + tail);
  const std::string script = dtrain::testing::source_dir() + "/bench/chaos/chaos_replay.py";
  auto segments = [&](const std::string& log, const std::string& final_step, const std::string& flag = "") {
    std::vector<std::string> argv = {dtrain::testing::python(), script, dir / log, final_step};
    if (!flag.empty()) argv.push_back(flag);
    return dtrain::testing::run_command(argv, dir / "segments.out", 60);
  };
  for (const char* log : {"rank_0.log", "lost_line.log"}) {
    auto [code, out] = segments(log, "31");
    const std::string name = log;
    INFO(name << ": " << out);
    CHECK(code == 0);
    CHECK(has(out, "segments: 0-10 on 3 node(s), 10-15 on 1 node(s), 15-31 on 2 node(s)\n"));
    CHECK(has(out, "steps 10-15 on 1 node(s), sampler at 120 samples, rounds 3\n"));
    CHECK(has(out, "steps 15-31 on 2 node(s), sampler at 180 samples, rounds 4,6\n"));
  }
  auto [code, out] = segments("rank_0.log", "31", "--each-restart");
  CHECK_MESSAGE(has(out, "segments: 0-10 on 3 node(s), 10-15 on 1 node(s), 15-27 on 2 node(s), 27-31 on 2 node(s)\n"),
                out);
  std::tie(code, out) = segments("rank_0.log", "32");
  CHECK(code == 1);
  CHECK_MESSAGE(has(out, "no round of rank_0.log saved the final step 32"), out);
  // checkpoint.async and checkpoint.memory on: every save is a commit line,
  // and round 4 resumes from memory at step 17, which only round 3 trained.
  dtrain::testing::write_file(
      dir / "async.log", section(1, 3, -1, 1, 12, {5, 10}, true) + section(2, 3, 10, 11, 22, {15, 20}, true) +
                             section(3, 1, 10, 11, 17, {15}, true) + section(4, 2, 17, 18, 27, {20, 25, 27}, true, true) +
                             section(5, 3, -1, 0, -1, {}, true) + section(6, 2, 27, 28, 31, {30, 31}, true));
  std::tie(code, out) = segments("async.log", "31");
  CHECK_MESSAGE(code == 0, out);
  CHECK_MESSAGE(has(out, "segments: 0-10 on 3 node(s), 10-17 on 1 node(s), 17-31 on 2 node(s)\n"), out);
}

TEST_CASE("chaos: a seeded campaign of 8 faults of every kind on 3 test hosts; every fault named, nothing lost") {
  if (const std::string why = TestHosts::unavailable_reason(); !why.empty()) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::test_hosts, "test hosts unavailable: " + why);
    return;
  }
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  dtrain::testing::TagGuard tag;
  const std::string out_dir = p.dir / "chaos";
  // The schedule draws each of the 7 kinds once per 7 faults, in a seeded
  // order, then an eighth. The script's own checks (each fault named and
  // recovered from, every redone step's loss equal to its first run, every
  // step run, no process or /dev/shm segment left) decide its exit code.
  // The job is long (5000 steps) and ends by SIGTERM 5 steps after the last
  // fault's recovery: no idle tail.
  auto [code, out] = dtrain::testing::run_command(
      {dtrain::testing::python(), dtrain::testing::source_dir() + "/bench/chaos/chaos.py", "--dtrain",
       dtrain::testing::dtrain_bin(), "--out", out_dir, "--hosts", "3", "--seed", "3", "--faults", "8",
       "--every-s", "0.5", "--steps", "5000", "--end", "signal", "--hosts-ready"},
      p.dir / "chaos.log", 400, {tag.env()});
  INFO(out);
  CHECK(code == 0);
  const std::string md = dtrain::testing::read_file(out_dir + "/chaos.md");
  CHECK(has(md, "- problems: none"));
  CHECK(has(md, "over redone steps "));
  for (const char* kind : {"kill_worker", "kill_agent", "hang", "slow_rank", "link_cut", "full_disk", "corrupt_ckpt"})
    CHECK_MESSAGE(has(md, std::string("| ") + kind + " |"), kind);
  CHECK(has(out, "goodput"));
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
}
