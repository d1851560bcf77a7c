// checkpoint.memory on test hosts (scripts/testhosts): elastic 2:3, a copy of
// every rank's state in its node's RAM and on the next node's, each step; a
// disk checkpoint every 4. Host 2 is cut after step 6: the survivors restore
// step 6 from memory (rank 2's shard from node 0's copy), not step 4 from
// disk, and train on to the losses of a run that restored from disk; with
// both copies of rank 2 gone, disk is used. Bad input stops before workers.
// Cases skip, saying why, without namespaces; nothing outlives a case.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/parity.h"
#include "tests/support/skip.h"
#include "tests/support/test_hosts.h"

using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::wait_until;
using dtrain::testing::TestHosts;
namespace parity = dtrain::testing::parity;
namespace fs = std::filesystem;

namespace {

constexpr int kRdzvPort = 29400;  // free inside host 0's fresh namespace
constexpr int kHangStep = 6;      // rank 2 stops after this step (and its copies)

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::unique_ptr<Child> start_agent(int i, const std::vector<std::string>& sets, const std::string& log,
                                   const TagGuard& tag) {
  auto& p = parity::Parity::get();
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml", "--node-rank",
                                   std::to_string(i), "--rdzv", TestHosts::addr(0) + ":" + std::to_string(kRdzvPort)};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return std::make_unique<Child>(TestHosts::in_host(i, argv), log,
                                 std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=peer-memory"});
}

std::vector<std::string> memory_sets(const std::string& run_dir) {
  return {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "checkpoint.every=4", "checkpoint.keep=20",
          "checkpoint.memory.every=1", "checkpoint.memory.replicas=1",
          // Rank 2 stops after step 6, its copies made: the cut cannot race the steps.
          "fault.kind=hang", "fault.rank=2", "fault.step=" + std::to_string(kHangStep),
          "cluster.nodes=\"2:3\"", "cluster.procs_per_node=1", "parallel.dp=auto", "train.micro_batch=2",
          "train.global_batch=12", "train.grad_accum=auto", "cluster.grace_s=1",
          "cluster.rendezvous.join_timeout_s=30", "cluster.rendezvous.last_call_s=2",
          "cluster.rendezvous.heartbeat_s=0.5", "cluster.recover_in_place=true",
          "cluster.rendezvous.rejoin_timeout_s=1",  // the cut host's agent gives up soon
          // These cases restore from the copies; the survivors' live state
          // (cluster.live_recovery) is the live cases'.
          "cluster.live_recovery=false"};
}

// The directory an agent said it keeps its copies in.
std::string memory_dir(const std::string& output) {
  static const std::regex re("keeps its in-memory copies in (\\S+)");
  std::smatch m;
  return std::regex_search(output, m, re) ? m[1].str() : "";
}

// metrics.jsonl's (step, loss) of the last round: the later value of a step wins.
std::map<int, double> losses_by_step(const std::string& path) {
  std::map<int, double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto s = line.find("\"step\": "), l = line.find("\"loss\": ");
    if (s != std::string::npos && l != std::string::npos)
      out[std::atoi(line.c_str() + s + 8)] = std::strtod(line.c_str() + l + 8, nullptr);
  }
  return out;
}

struct Run {
  std::string out0, out1, out2;  // the agents' output
  std::map<int, double> losses;
};

// The directory of a copy of `step` in a node's memory directory
// (step_<N>.<id>), "" when there is none yet.
std::string copy_dir(const std::string& root, int step) {
  std::error_code ec;
  const std::string prefix = "step_" + std::to_string(step) + ".";
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path().string();
  return "";
}

// One elastic run: three agents, host 2 cut once every node holds step 6 in
// memory; `before_cut` runs then (with node 0's directory). Host 2 is healed after.
template <typename BeforeCut>
Run run_and_cut(TestHosts& hosts, const std::string& name, BeforeCut before_cut,
                const std::vector<std::string>& extra = {}) {
  auto& p = parity::Parity::get();
  const std::string run_dir = p.dir / name;
  TagGuard tag;
  std::vector<std::unique_ptr<Child>> agents;
  auto log = [&](int i) { return p.dir / (name + "_node" + std::to_string(i) + ".log"); };
  std::vector<std::string> sets = memory_sets(run_dir);
  sets.insert(sets.end(), extra.begin(), extra.end());  // later sets win
  agents.push_back(start_agent(0, sets, log(0), tag));
  REQUIRE_MESSAGE(wait_until([&] { return has(agents[0]->output(), "listening on port"); }, 30), agents[0]->output());
  for (int i = 1; i < 3; ++i) agents.push_back(start_agent(i, sets, log(i), tag));
  std::vector<std::string> dirs(3);
  const bool held = wait_until([&] {
    for (int i = 0; i < 3; ++i) dirs[size_t(i)] = memory_dir(agents[size_t(i)]->output());
    if (dirs[0].empty() || dirs[2].empty()) return false;
    const std::string step0 = copy_dir(dirs[0], kHangStep), step2 = copy_dir(dirs[2], kHangStep);
    return !step0.empty() && fs::exists(step0 + "/rank_2.safetensors") && fs::exists(step0 + "/rank_2.peer") &&
           !step2.empty() && fs::exists(step2 + "/rank_2.safetensors");
  }, 120);
  REQUIRE_MESSAGE(held, agents[0]->output());
  before_cut(dirs[0]);
  hosts.cut(2);
  for (int i = 0; i < 3; ++i) {
    INFO("node " << i << ":\n" << agents[size_t(i)]->output());
    REQUIRE(agents[size_t(i)]->wait(120));
  }
  hosts.heal(2);
  Run r{agents[0]->output(), agents[1]->output(), agents[2]->output(), losses_by_step(run_dir + "/metrics.jsonl")};
  INFO("node 0:\n" << r.out0 << "\nnode 1:\n" << r.out1 << "\nnode 2:\n" << r.out2);
  CHECK(agents[0]->exit_code() == 0);
  CHECK(agents[1]->exit_code() == 0);
  CHECK(agents[2]->exit_code() != 0);
  CHECK(has(r.out0, "rendezvous round 2 closed (restart 0): 2 nodes, world 2, mesh dp=2"));
  // The survivors keep their workers (cluster.recover_in_place), which
  // restore the copies in the same process; the round closes
  // without a last call once both are back.
  CHECK(has(r.out0, "keeping 1 worker(s) for the next round (cluster.recover_in_place)"));
  CHECK(has(r.out1, "keeping 1 worker(s) for the next round (cluster.recover_in_place)"));
  // Every node's directory is gone, the cut node's too (its agent ended).
  for (const auto& d : dirs) CHECK_MESSAGE(!fs::exists(d), d);
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  return r;
}

double median(std::vector<double> v) {
  REQUIRE(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Rank 0's checkpoint records of `path` at steps with an in-memory copy and no
// disk save: the step loop's blocking (ckpt_block_ms) over a copy's whole time
// (memory_copy_ms, what a synchronous copy would block for), medians.
// Background copies block for their host copies (and a wait for the copy
// before, when one takes longer than a step): well under 1; a synchronous
// copy (DTRAIN_MEMORY_COPY_SYNC=1) blocks for all of it: above 1.
double copy_block_ratio(const std::string& path, int* records) {
  std::vector<double> block, copy;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto b = line.find("\"ckpt_block_ms\": "), m = line.find("\"memory_copy_ms\": ");
    if (b == std::string::npos || m == std::string::npos || has(line, "ckpt_write_ms")) continue;
    block.push_back(std::strtod(line.c_str() + b + 17, nullptr));
    copy.push_back(std::strtod(line.c_str() + m + 18, nullptr));
  }
  *records = int(block.size());
  INFO(path << ": " << block.size() << " copy records");
  return median(block) / std::max(median(copy), 1e-9);
}

double max_rel_diff(const std::map<int, double>& a, const std::map<int, double>& b, int first, int last, int shift) {
  double worst = 0;
  for (int step = first; step <= last; ++step) {
    REQUIRE(a.count(step));
    REQUIRE(b.count(step + shift));
    worst = std::max(worst, std::fabs(a.at(step) - b.at(step + shift)) / std::max(std::fabs(b.at(step + shift)), 1e-12));
  }
  return worst;
}

// `run`'s losses equal `ref`'s over steps first..kSteps within the parity
// tolerance, printed; negative control: `run` one step off (steps
// control_first..kSteps), which must miss by kControlFactor x the tolerance.
void check_same_losses(const std::string& what, const std::map<int, double>& run, const std::map<int, double>& ref,
                       int first, int control_first) {
  const double diff = max_rel_diff(run, ref, first, parity::kSteps, 0);
  const double control = max_rel_diff(run, ref, control_first, parity::kSteps, -1);
  MESSAGE(what << ", steps " << first << ".." << parity::kSteps << ": max loss rel diff " << diff << " (tolerance "
               << parity::kLossRelTol << "); negative control (one step off) " << control);
  CHECK(diff <= parity::kLossRelTol);
  CHECK(control >= parity::kControlFactor * parity::kLossRelTol);
}

// Whether this case cannot run here (no network namespaces): then it is
// reported as skipped, saying why.
bool skipped_without_test_hosts() {
  const std::string why = TestHosts::unavailable_reason();
  if (why.empty()) return false;
  dtrain::testing::skip_case(dtrain::testing::SkipKind::test_hosts, "test hosts unavailable: " + why);
  return true;
}

// Two agents on test hosts 0 and 1 (cluster.nodes 2, one rank each,
// checkpoint.memory every 10, disk every 100, one restart allowed, restores
// from copies or disk: cluster.live_recovery false) with
// `extra` sets; `during(run_dir)` runs once both have started. Both must
// end with 0 and leave no process.
template <typename During>
Run two_node_run(const std::string& name, const std::vector<std::string>& extra, During during) {
  auto& p = parity::Parity::get();
  const std::string run_dir = p.dir / name;
  std::vector<std::string> sets = {
      "log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "checkpoint.every=100", "checkpoint.keep=5",
      "checkpoint.memory.every=10", "checkpoint.memory.replicas=1", "cluster.nodes=2", "cluster.procs_per_node=1",
      "parallel.dp=auto", "train.micro_batch=2", "train.global_batch=12", "train.grad_accum=auto",
      "cluster.max_restarts=1", "cluster.recover_in_place=true", "cluster.grace_s=1",
      "cluster.rendezvous.join_timeout_s=30", "cluster.rendezvous.last_call_s=1",
      "cluster.rendezvous.heartbeat_s=0.5", "cluster.live_recovery=false"};
  sets.insert(sets.end(), extra.begin(), extra.end());  // later sets win
  TagGuard tag;
  std::vector<std::unique_ptr<Child>> agents;
  auto log = [&](int i) { return p.dir / (name + "_node" + std::to_string(i) + ".log"); };
  agents.push_back(start_agent(0, sets, log(0), tag));
  REQUIRE_MESSAGE(wait_until([&] { return has(agents[0]->output(), "listening on port"); }, 30), agents[0]->output());
  agents.push_back(start_agent(1, sets, log(1), tag));
  during(run_dir);
  for (auto& a : agents) {
    INFO("node 0:\n" << agents[0]->output() << "\nnode 1:\n" << agents[1]->output());
    REQUIRE(a->wait(180));
    CHECK(a->exit_code() == 0);
  }
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  return Run{agents[0]->output(), agents[1]->output(), "", losses_by_step(run_dir + "/metrics.jsonl")};
}

}  // namespace

TEST_CASE("checkpoint.memory 2:3: a cut host's state comes from peer memory at a step newer than disk; "
          "with both copies gone, from disk") {
  if (skipped_without_test_hosts()) return;
  TestHosts hosts(3);
  const Run memory = run_and_cut(hosts, "memory", [](const std::string&) {});
  INFO("node 0:\n" << memory.out0);
  // Node 2 was node 0's predecessor: node 0 held rank 2's copy.
  CHECK(has(memory.out0, "restored step 6 of rank 2 from peer memory on node 0"));
  CHECK(has(memory.out0, "restored step 6 of rank 0 from its own node's memory on node 0"));
  CHECK(has(memory.out0, "restored step 6 of rank 1 from its own node's memory on node 1"));
  CHECK(has(memory.out0, "resuming from step 6 (in-memory copies; disk has step 4)"));
  // The copies are made in the background: the step loop blocks for less
  // than a copy takes (a ratio within one run, not seconds).
  int records = 0;
  const double ratio = copy_block_ratio(parity::Parity::get().dir / "memory/metrics.jsonl", &records);
  MESSAGE("in-memory copies: median ckpt_block_ms / median memory_copy_ms = " << ratio << " over " << records
                                                                             << " records (must be < 0.5)");
  CHECK(ratio < 0.5);

  // Both copies of rank 2 lost: host 2 with its own, and node 0's copy removed.
  const Run disk = run_and_cut(hosts, "disk", [](const std::string& node0) {
    for (const auto& e : fs::directory_iterator(node0)) fs::remove(e.path() / "rank_2.safetensors");
  });
  INFO("node 0 (both copies lost):\n" << disk.out0);
  CHECK(has(disk.out0, "no node holds step 6 of rank 2 in memory (both copies are gone): resuming from disk, step 4"));
  CHECK(has(disk.out0, "resuming from step 4 ("));
  CHECK_FALSE(has(disk.out0, "restored step"));

  // After step 6 both ran on the same 2 hosts from the same state (one
  // restored from memory, one recomputed from disk's step 4): equal losses.
  // Negative control: one step off (a restore that lost a step).
  check_same_losses("memory vs disk restore", memory.losses, disk.losses, kHangStep + 1, kHangStep + 1);
}

// A host cut off keeps the copies it held; the survivors restore, train on
// without it and make new ones. Its copies are then another timeline's, and
// one can be complete and newer than any of theirs (each node holds every
// rank's file at replicas 2 on 3 nodes; a copy it finished receiving as the
// link went). Planted here: host 2's newest complete copy renamed to a far
// step. Its agent drops its copies when it re-joins, so round 3 resumes from
// the survivors' newest state. Negative control (run once by hand, with the
// drop in launcher/rejoin.cpp removed): round 3 took the planted copy and
// resumed from host 2's old step, behind the survivors.
TEST_CASE("checkpoint.memory 2:3: a host that re-joins after a cut drops its copies; round 3 resumes from the "
          "survivors' newest state, not a newer-numbered copy of the cut host's") {
  if (skipped_without_test_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  TagGuard tag;
  const std::string run_dir = p.dir / "rejoin_drop";
  constexpr int kRejoinSteps = 80;
  std::vector<std::string> sets = memory_sets(run_dir);
  for (auto& s : sets) {  // paced steps (>= 100 ms: round 2 trains while host 2 is cut), not a hang
    if (s.rfind("fault.kind=", 0) == 0) s = "fault.kind=slow";
    if (s.rfind("fault.rank=", 0) == 0) s = "fault.rank=0";
    if (s.rfind("fault.step=", 0) == 0) s = "fault.step=1";
    if (s.rfind("checkpoint.memory.replicas=", 0) == 0) s = "checkpoint.memory.replicas=2";
    if (s.rfind("cluster.rendezvous.rejoin_timeout_s=", 0) == 0) s = "cluster.rendezvous.rejoin_timeout_s=120";
  }
  sets.insert(sets.end(), {"fault.ms=100", "train.steps=" + std::to_string(kRejoinSteps)});
  std::vector<std::unique_ptr<Child>> agents;
  auto log = [&](int i) { return p.dir / ("rejoin_drop_node" + std::to_string(i) + ".log"); };
  agents.push_back(start_agent(0, sets, log(0), tag));
  REQUIRE_MESSAGE(wait_until([&] { return has(agents[0]->output(), "listening on port"); }, 30), agents[0]->output());
  for (int i = 1; i < 3; ++i) agents.push_back(start_agent(i, sets, log(i), tag));
  auto out = [&](int i) { return agents[size_t(i)]->output(); };
  const std::string metrics = run_dir + "/metrics.jsonl";
  REQUIRE_MESSAGE(wait_until([&] { return losses_by_step(metrics).size() >= 6; }, 180), out(0));
  const std::string dir2 = memory_dir(out(2));
  REQUIRE_MESSAGE(!dir2.empty(), out(2));
  hosts.cut(2);
  REQUIRE_MESSAGE(wait_until([&] { return has(out(2), "re-joining for up to 120 s"); }, 60), out(2));
  REQUIRE_MESSAGE(wait_until([&] { return has(out(0), "round 2 closed (restart 0): 2 nodes"); }, 60), out(0));
  // Host 2's newest complete copy (every rank's file of world 3), renamed
  // far ahead of any step the survivors will reach.
  int old_step = -1;
  std::string newest;
  for (const auto& e : fs::directory_iterator(dir2)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;
    bool complete = fs::exists(e.path() / "header.json");
    for (int r = 0; r < 3; ++r) complete = complete && fs::exists(e.path() / ("rank_" + std::to_string(r) + ".safetensors"));
    const int step = std::atoi(name.c_str() + 5);
    if (complete && step > old_step) {
      old_step = step;
      newest = e.path().string();
    }
  }
  REQUIRE_MESSAGE(old_step > 0, "no complete copy in " << dir2);
  const std::string planted = dir2 + "/step_99999" + newest.substr(newest.rfind('.'));
  fs::rename(newest, planted);
  // The survivors train past host 2's step before the link returns.
  REQUIRE_MESSAGE(wait_until([&] { return losses_by_step(metrics).rbegin()->first >= old_step + 4; }, 120), out(0));
  dtrain::testing::heal_and_finish(hosts, 2, agents, "round 3 closed (restart 0): 3 nodes");
  const std::string out0 = out(0), out2 = out(2);
  INFO("node 0:\n" << out0 << "\nnode 2:\n" << out2);
  CHECK(has(out2, "re-joined the rendezvous "));
  CHECK(has(out2, "dropped this node's in-memory copies ("));
  const auto at = out0.rfind("resuming from step ");
  REQUIRE(at != std::string::npos);
  const int resumed = std::atoi(out0.c_str() + at + 19);
  MESSAGE("re-join after a cut: host 2's newest copy was of step " << old_step << " (planted as step 99999); round 3 "
          "resumed from step " << resumed << " (must be after it)");
  CHECK(resumed > old_step);
  CHECK(losses_by_step(metrics).rbegin()->first == kRejoinSteps);
  CHECK(!fs::exists(dir2));
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
}

TEST_CASE("checkpoint.memory bad input: every < 0 is refused naming the field; one node warns and keeps none") {
  auto& p = parity::Parity::get();
  const std::string dtrain = dtrain::testing::dtrain_bin();
  for (const std::string every : {"-1", "-2"}) {
    auto [code, out] = dtrain::testing::run_command(
        {dtrain, "plan", p.dir / "spec.yaml", "--set", "checkpoint.memory.every=" + every, "--set", "cluster.nodes=2"},
        p.dir / "memory_bad.log", 60);
    CHECK_MESSAGE(code == 2, out);
    CHECK_MESSAGE(has(out, "--set checkpoint.memory.every=" + every + ": checkpoint.memory.every = " + every +
                               ": must be >= 1 (steps between in-memory copies)"),
                  out);
  }
  // One node: a warning, then training with disk checkpoints only (no copies kept).
  const std::string run_dir = p.dir / "memory_one_node";
  auto [code, out] = dtrain::testing::run_command(
      {dtrain, "launch", p.dir / "spec.yaml", "--set", "checkpoint.memory.every=2", "--set", "train.steps=2",
       "--set", "log.dir=" + run_dir, "--set", "checkpoint.dir=" + run_dir + "/ckpt"},
      p.dir / "memory_one_node.log", 120);
  CHECK_MESSAGE(code == 0, out);
  CHECK_MESSAGE(has(out, "checkpoint.memory.replicas = 1 is ignored on a single node (cluster.nodes = 1)"), out);
  CHECK_MESSAGE(!has(out, "keeps its in-memory copies"), out);
}

// A restarted round with checkpoint.memory expects its state from the nodes'
// copies and builds its model without drawing the weights (train_session.h);
// a rank killed after step 2, before the first copy (every 10) and with no
// checkpoint on disk, leaves nothing to restore: the weights are drawn after
// all, and the run from step 1 equals a fault-free one, step for step.
// Negative control (run once by hand, with rebuild_drawn's call in
// trainer.cpp removed): the restarted run trained from LibTorch's module
// defaults; max loss rel diff 0.106 (10^4 x kLossRelTol), and this case failed.
TEST_CASE("checkpoint.memory 2 nodes: a restart before any copy or checkpoint draws the weights after all and "
          "trains as a fault-free run") {
  if (skipped_without_test_hosts()) return;
  TestHosts hosts(2);
  const std::vector<std::string> fault = {"fault.kind=kill_after_step", "fault.rank=1", "fault.step=2"};
  const auto none = [](const std::string&) {};
  const Run clean = two_node_run("draw_clean", {}, none);
  const Run restarted = two_node_run("draw_after_all", fault, none);
  INFO("restarted, node 0:\n" << restarted.out0);
  CHECK_FALSE(has(clean.out0, "initial weights not drawn"));
  CHECK(has(restarted.out0, "rendezvous round 2 closed (restart 1)"));
  CHECK(has(restarted.out0, "initial weights not drawn: every rank restores its state next"));
  CHECK(has(restarted.out0, "no checkpoint or in-memory copy was restored: the weights are drawn from job.seed after all"));
  check_same_losses("restart before any copy vs fault-free", restarted.losses, clean.losses, 1, 2);
}

// A restore from the nodes' memory at a step no older than disk's `latest`
// does not read `latest` (rank 0 verifying every shard of it held up every
// rank's restart); it is verified after, in the background, and named when
// it does not verify. Here step_4 is corrupted while rank 1 hangs after
// step 6: the restart restores step 6 from memory, then names step_4.
// Negative control (run once by hand on the order before: rank 0 verified
// disk first): "checkpoint: skipped step_4", then "no checkpoint ... verifies"
// and the job failed, though every node held step 6 in memory.
TEST_CASE("checkpoint.memory 2 nodes: a restore from memory does not read disk's latest first; a corrupt one is "
          "named after, in the background") {
  if (skipped_without_test_hosts()) return;
  TestHosts hosts(2);
  int corrupted = 0;
  const Run r = two_node_run(
      "verify_after", {"checkpoint.every=4", "checkpoint.memory.every=1", "fault.kind=hang", "fault.rank=1",
                       "fault.step=6", "cluster.hang_timeout_s=3"},
      [&](const std::string& run_dir) {
        // Rank 1 stops after step 6 (its copy made); step_4 is on disk by then.
        REQUIRE(wait_until([&] { return losses_by_step(run_dir + "/metrics.jsonl").count(6) > 0; }, 120));
        corrupted = dtrain::testing::corrupt_step(run_dir + "/ckpt/step_4");
      });
  INFO("node 0:\n" << r.out0);
  CHECK(corrupted == 2);
  CHECK(has(r.out0, "resuming from step 6 (in-memory copies; disk has step 4)"));
  CHECK(has(r.out0, "checkpoint: step_4 does not verify: "));
  CHECK(has(r.out0, "checksum mismatch"));
  CHECK_FALSE(has(r.out0, "checkpoint: skipped step_4"));
  CHECK(r.losses.rbegin()->first == parity::kSteps);
}

// cluster.live_recovery (the default): the round after a cut takes the
// survivors' state as they left it, in place, instead of the copies. Host 2
// is cut as in the memory case (rank 2 stopped after step 6, the survivors
// wait in step 7): both survivors hold step 6, nothing is sent, nothing is
// read, and the losses equal those of the run that restored step 6 from the
// copies, step for step. Negative control: one step off.
TEST_CASE("cluster.live_recovery 2:3: after a cut the survivors keep their own state (nothing read, nothing "
          "sent); losses equal a restore from the in-memory copies") {
  if (skipped_without_test_hosts()) return;
  TestHosts hosts(3);
  const Run live = run_and_cut(hosts, "live_cut", [](const std::string&) {}, {"cluster.live_recovery=true"});
  INFO("node 0:\n" << live.out0);
  CHECK(has(live.out0, "resuming from step 6 (live state: kept in place by rank(s) 0,1, sent by rank 0 to rank(s) "
                       "none"));
  CHECK_FALSE(has(live.out0, "restored step"));
  const Run memory = run_and_cut(hosts, "live_cut_ref", [](const std::string&) {});
  CHECK(has(memory.out0, "resuming from step 6 (in-memory copies; disk has step 4)"));
  check_same_losses("live state vs in-memory copies after the cut", live.losses, memory.losses, kHangStep + 1,
                    kHangStep + 1);
}

// cluster.live_recovery with a killed rank: its replacement (a warm spare)
// receives the survivor's state at the last step both completed; no copy
// exists yet (every 10) and disk has none, yet no step is redone and the
// run equals a fault-free one, step for step. Negative control: one step off.
TEST_CASE("cluster.live_recovery 2 nodes: a killed rank's replacement receives the survivor's state; no step "
          "redone; the run equals a fault-free one") {
  if (skipped_without_test_hosts()) return;
  TestHosts hosts(2);
  const auto none = [](const std::string&) {};
  const Run clean = two_node_run("live_clean", {"cluster.live_recovery=true"}, none);
  const Run killed = two_node_run(
      "live_kill", {"cluster.live_recovery=true", "fault.kind=kill_after_step", "fault.rank=1", "fault.step=3"},
      none);
  INFO("killed, node 0:\n" << killed.out0);
  CHECK(has(killed.out0, "rendezvous round 2 closed (restart 1)"));
  CHECK(has(killed.out0, "resuming from step 3 (live state: kept in place by rank(s) 0, sent by rank 0 to rank(s) 1"));
  CHECK_FALSE(has(killed.out0, "drawn from job.seed after all"));
  // Steps 1..kSteps each logged once: none redone.
  std::ifstream in(parity::Parity::get().dir / "live_kill/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(in, line);)
    if (has(line, "\"loss\": ")) ++records;
  CHECK(records == parity::kSteps);
  check_same_losses("live recovery of a killed rank vs fault-free", killed.losses, clean.losses, 1, 2);
}
