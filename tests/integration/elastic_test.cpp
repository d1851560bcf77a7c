// Elastic shrink on test hosts (scripts/testhosts): nodes "2:3", dp and
// grad_accum auto with a fixed train.global_batch. A cut host is named, the
// survivors re-form on 2 and finish from the last checkpoint, matching a plain
// 2-host run resumed from it; a node that comes back joins the next round.
// Cases skip, saying why, without namespaces; no process outlives a case.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/parity.h"
#include "tests/support/skip.h"
#include "tests/support/test_hosts.h"

using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::wait_until;
using dtrain::testing::TestHosts;
namespace parity = dtrain::testing::parity;

namespace {

using parity::step_losses;

// Inside host 0's fresh namespace: free. Every run of a case uses it: the
// connections of a finished run linger in TIME_WAIT there, and node 0 must
// still serve the next run rather than join a server that is gone.
constexpr int kRdzvPort = 29400;
constexpr int kGlobalBatch = 12;  // dp 3: grad_accum 2; dp 2: grad_accum 3

bool skip_without_hosts() {
  static const std::string why = TestHosts::unavailable_reason();
  if (why.empty()) return false;
  dtrain::testing::skip_case(dtrain::testing::SkipKind::test_hosts, "test hosts unavailable: " + why);
  return true;
}

// `dtrain launch --node-rank i --rdzv <host 0>:29400` inside host i.
std::unique_ptr<Child> start_agent(int i, const std::string& spec, const std::vector<std::string>& sets,
                                   const std::string& log, const TagGuard& tag,
                                   const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", spec, "--node-rank",
                                   std::to_string(i), "--rdzv",
                                   TestHosts::addr(0) + ":" + std::to_string(kRdzvPort)};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return std::make_unique<Child>(
      TestHosts::in_host(i, argv), log,
      std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=elastic-test"});
}

// Node 0 first (it hosts the rendezvous), then the others once it listens:
// their first connection then finds the server (no gRPC reconnect back-off),
// so all three joins fall inside round 1's last call.
template <typename Start>
void start_three(std::vector<std::unique_ptr<Child>>& agents, Start start) {
  agents.push_back(start(0));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (agents[0]->output().find("listening on port") == std::string::npos &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE_MESSAGE(agents[0]->output().find("listening on port") != std::string::npos, agents[0]->output());
  for (int i = 1; i < 3; ++i) agents.push_back(start(i));
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Every "pid N" an agent printed (its workers): none may be alive after it.
std::set<int> printed_pids(const std::string& output) {
  std::set<int> pids;
  static const std::regex re("pid ([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    pids.insert(std::stoi((*it)[1]));
  return pids;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-12));
  return worst;
}

// The shared settings: elastic 2:3, one worker per host, dp and grad_accum
// auto, a checkpoint every 2 steps (all kept, so the reference can start
// from the one the survivors resumed from), short heartbeats.
std::vector<std::string> elastic_sets(const std::string& run_dir) {
  return {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "checkpoint.every=2",
          // Paces the steps (>= 40 ms each, no effect on the numbers) so the
          // cut lands mid-run, not after the last step.
          "fault.kind=slow", "fault.rank=0", "fault.step=1", "fault.ms=40",
          "checkpoint.keep=20", "cluster.nodes=\"2:3\"", "cluster.procs_per_node=1",
          "parallel.dp=auto", "train.micro_batch=2", "train.global_batch=" + std::to_string(kGlobalBatch),
          "train.grad_accum=auto", "cluster.grace_s=1", "cluster.rendezvous.join_timeout_s=30",
          // Room for all three first joins to make round 1 under load; the
          // re-formed round waits as long for a straggler.
          "cluster.rendezvous.last_call_s=2", "cluster.rendezvous.heartbeat_s=0.5",
          // A cut host gives up re-joining after 1 s (the re-join case raises it).
          "cluster.rendezvous.rejoin_timeout_s=1"};
}

// This job's dtrain-worker processes (by the test tag), each with the RANK
// it was started with (/proc/<pid>/environ is the initial environment).
std::map<int, int> worker_pids(const std::string& tag) {
  std::map<int, int> out;  // pid -> initial rank
  for (pid_t pid : dtrain::testing::tagged_pids(tag)) {
    const std::string proc = "/proc/" + std::to_string(pid);
    if (dtrain::testing::read_file(proc + "/comm").rfind("dtrain-worker", 0) != 0) continue;
    std::string env = dtrain::testing::read_file(proc + "/environ");
    for (auto& c : env) if (c == '\0') c = '\n';
    const auto at = ("\n" + env).find("\nRANK=");
    out[pid] = at == std::string::npos ? -1 : std::atoi(env.c_str() + at + 5);
  }
  return out;
}

// A 2-host run of the same spec resumed from `from` (run dir <fixture>/<name>);
// its losses by step.
std::map<int, double> resumed_on_two_hosts(const std::string& name, const std::string& from,
                                           std::vector<std::string> extra) {
  auto& p = parity::Parity::get();
  TagGuard tag;
  const std::string run_dir = p.dir / name;
  std::vector<std::string> sets = elastic_sets(run_dir);
  sets.push_back("cluster.nodes=2");
  sets.insert(sets.end(), extra.begin(), extra.end());
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i)
    agents.push_back(start_agent(i, p.dir / "spec.yaml", sets,
                                 p.dir / (name + "_node" + std::to_string(i) + ".log"), tag,
                                 {"--resume-from", from}));
  for (auto& a : agents) {
    INFO(name << ":\n" << a->output());
    REQUIRE(a->wait(120));
    REQUIRE(a->exit_code() == 0);
  }
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  std::map<int, double> out;
  for (auto [step, loss] : step_losses(run_dir + "/metrics.jsonl")) out[step] = loss;
  return out;
}

// The steps the re-formed round trained: it resumed from checkpoint K
// (rank 0's output says which), so metrics.jsonl holds round 1's steps,
// then K+1 .. kSteps; their losses, in order.
struct Resumed {
  int step = 0;
  size_t first_round_steps = 0;  // lines of metrics.jsonl before the resumed ones
  std::vector<double> losses;
};

Resumed losses_after_resume(const std::string& run_dir, const std::string& out0) {
  const auto all = step_losses(run_dir + "/metrics.jsonl");
  const auto at = out0.find("resuming from step ");
  REQUIRE_MESSAGE(at != std::string::npos, out0);
  Resumed r;
  r.step = std::atoi(out0.c_str() + at + 19);
  REQUIRE(all.size() > size_t(parity::kSteps - r.step));
  r.first_round_steps = all.size() - size_t(parity::kSteps - r.step);
  for (size_t i = r.first_round_steps; i < all.size(); ++i) {
    CHECK(all[i].first == r.step + 1 + int(i - r.first_round_steps));
    r.losses.push_back(all[i].second);
  }
  return r;
}

// The survivors' losses vs 2 hosts resumed from the same checkpoint (the
// reference) and vs a negative control with grad_accum fixed at 2, so that
// the global batch shrinks to 8 with the world.
void check_matches_two_hosts(const std::string& name, const std::string& label, const std::string& from,
                             int resumed, const std::vector<double>& losses) {
  const auto ref = resumed_on_two_hosts(name + "_ref", from, {});
  const auto control = resumed_on_two_hosts(name + "_control", from, {"train.global_batch=0", "train.grad_accum=2"});
  std::vector<double> ref_losses, control_losses;
  for (int step = resumed + 1; step <= parity::kSteps; ++step) {
    REQUIRE(ref.count(step));
    REQUIRE(control.count(step));
    ref_losses.push_back(ref.at(step));
    control_losses.push_back(control.at(step));
  }
  const double diff = max_rel_diff(losses, ref_losses);
  const double control_diff = max_rel_diff(control_losses, ref_losses);
  MESSAGE(label << " vs 2 hosts resumed from step " << resumed << ": max loss rel diff " << diff << " (tolerance "
                << parity::kLossRelTol << "); negative control (global batch 8) " << control_diff);
  CHECK(diff <= parity::kLossRelTol);
  CHECK(control_diff >= parity::kControlFactor * parity::kLossRelTol);
}

}  // namespace

TEST_CASE("elastic 2:3: a cut host is named; the survivors re-form on 2, same global batch, to the end") {
  if (skip_without_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  const std::string run_dir = p.dir / "elastic";
  std::vector<std::unique_ptr<Child>> agents;
  {
    TagGuard tag;
    // The restart path (recovery in place has its own case below): the
    // survivors stop their workers and start new ones.
    std::vector<std::string> sets = elastic_sets(run_dir);
    sets.push_back("cluster.recover_in_place=false");
    start_three(agents, [&](int i) {
      return start_agent(i, p.dir / "spec.yaml", sets, p.dir / ("elastic_node" + std::to_string(i) + ".log"), tag);
    });
    // Cut host 2 once training is at step 6 or later (a checkpoint exists).
    const bool trained = wait_until([&] {
      return parity::read_metric(run_dir + "/metrics.jsonl", "loss").size() >= 6;
    }, 180);
    REQUIRE_MESSAGE(trained, agents[0]->output());
    const size_t cut_at = parity::read_metric(run_dir + "/metrics.jsonl", "loss").size();
    hosts.cut(2);
    for (int i = 0; i < 3; ++i) {
      INFO("node " << i << ":\n" << agents[size_t(i)]->output());
      REQUIRE(agents[size_t(i)]->wait(180));
    }
    const std::string out0 = agents[0]->output(), out1 = agents[1]->output();
    const std::string out2 = agents[2]->output();
    INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1 << "\nnode 2:\n" << out2);
    REQUIRE(cut_at < size_t(parity::kSteps));  // the cut came mid-run
    CHECK(agents[0]->exit_code() == 0);
    CHECK(agents[1]->exit_code() == 0);
    CHECK(agents[2]->exit_code() != 0);
    CHECK(has(out2, "lost the rendezvous server"));
    CHECK(has(out2, "; stopped this node's workers, re-joining for up to 1 s (cluster.rendezvous.rejoin_timeout_s)"));
    CHECK(has(out2, " s (cluster.rendezvous.rejoin_timeout_s = 1); last attempt: "));
    // Round 1 on 3 nodes (dp 3, grad_accum 2), round 2 on the survivors (dp 2, grad_accum 3).
    CHECK(has(out0, "rendezvous round 1 closed (restart 0): 3 nodes, world 3, mesh dp=3"));
    CHECK(has(out0, "rendezvous round 2 closed (restart 0): 2 nodes, world 2, mesh dp=2"));
    for (const std::string& out : {out0, out1}) {
      CHECK(has(out, "lost node 2: id '" + TestHosts::addr(2) + ":"));
      CHECK(has(out, "address " + TestHosts::addr(2) + ", hostname "));
      CHECK(has(out, "last heartbeat "));
      // Workers waiting on the lost node are stopped at once, not after grace_s.
      CHECK(has(out, "stopping 1 worker(s) with SIGKILL now"));
      CHECK(has(out, "round 1: 3 node(s), world 3: parallel.dp = auto -> 3 (world 3 / (tp 1 x pp 1)), "
                     "train.grad_accum = auto -> 2 (global_batch 12 / (micro_batch 2 x dp 3)); "
                     "global batch 12"));
      CHECK(has(out, "round 2: 2 node(s), world 2: parallel.dp = auto -> 2 (world 2 / (tp 1 x pp 1)), "
                     "train.grad_accum = auto -> 3 (global_batch 12 / (micro_batch 2 x dp 2)); "
                     "global batch 12"));
    }
    // The workers of round 2 read those numbers from DTRAIN_SPEC.
    const std::string resolved = dtrain::testing::read_file(run_dir + "/spec.resolved.yaml");
    CHECK(has(resolved, "  dp: 2\n"));
    CHECK(has(resolved, "  grad_accum: 3\n"));
    CHECK(has(out0, "GBS = micro_batch(2) x grad_accum(3) x dp(2) = 12 sequences (train.global_batch)"));
    // No process of the job is left: by tag and by every pid the agents named.
    CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
    for (const std::string& out : {out0, out1, out2})
      for (int pid : printed_pids(out)) CHECK_MESSAGE(!dtrain::testing::pid_alive(pid), "pid " << pid);
  }

  const Resumed r = losses_after_resume(run_dir, agents[0]->output());
  const int resumed = r.step;
  const size_t second = r.first_round_steps;
  const std::vector<double>& elastic = r.losses;
  MESSAGE("elastic: round 1 trained " << second << " steps on 3 hosts, the survivors resumed from step "
                                      << resumed << " on 2");
  CHECK(resumed >= 2);
  const std::string from = run_dir + "/ckpt/step_" + std::to_string(resumed);

  hosts.heal(2);
  check_matches_two_hosts("elastic", "elastic", from, resumed, elastic);
}

// Recovery in place: the survivors' workers are told round 2 by their agents
// and train it in the same processes (warm spares off, so that any new
// process has a pid never seen before the cut); their losses from the
// restored step equal a 2-host run resumed from it.
TEST_CASE("elastic 2:3, recover_in_place: the survivors keep their worker pids; losses match 2 hosts") {
  if (skip_without_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  const std::string run_dir = p.dir / "in_place";
  std::vector<std::unique_ptr<Child>> agents;
  std::set<int> before, after;  // the survivors' worker pids before the cut; every worker pid but rank 2's after
  int lost_pid = -1;
  {
    TagGuard tag;
    std::vector<std::string> sets = elastic_sets(run_dir);
    // The survivors restore from disk here (its reference resumes a 2-host
    // run from the same checkpoint); their live state is peer_memory_test's.
    sets.insert(sets.end(), {"cluster.recover_in_place=true", "cluster.warm_spares=false",
                             "cluster.live_recovery=false"});
    start_three(agents, [&](int i) {
      return start_agent(i, p.dir / "spec.yaml", sets, p.dir / ("in_place_node" + std::to_string(i) + ".log"), tag);
    });
    const bool trained = wait_until([&] {
      return parity::read_metric(run_dir + "/metrics.jsonl", "loss").size() >= 6;
    }, 180);
    REQUIRE_MESSAGE(trained, agents[0]->output());
    for (auto [pid, rank] : worker_pids(tag.tag())) {
      if (rank == 2) lost_pid = pid;
      else before.insert(pid);
    }
    REQUIRE_MESSAGE(before.size() == 2, "workers of ranks 0 and 1 before the cut: " << before.size());
    hosts.cut(2);
    // Every worker process seen from the cut to the end of the job.
    wait_until([&] {
      for (auto [pid, rank] : worker_pids(tag.tag()))
        if (pid != lost_pid) after.insert(pid);
      return agents[0]->wait(0.02) && agents[1]->wait(0.02);
    }, 180);
    for (int i = 0; i < 3; ++i) {
      INFO("node " << i << ":\n" << agents[size_t(i)]->output());
      REQUIRE(agents[size_t(i)]->wait(180));
    }
    const std::string out0 = agents[0]->output(), out1 = agents[1]->output();
    INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
    CHECK(agents[0]->exit_code() == 0);
    CHECK(agents[1]->exit_code() == 0);
    CHECK(has(out0, "rendezvous round 2 closed (restart 0): 2 nodes, world 2, mesh dp=2"));
    for (const std::string& out : {out0, out1}) {
      CHECK(has(out, "keeping 1 worker(s) for the next round (cluster.recover_in_place)"));
      CHECK(has(out, " continues in pid "));
      CHECK(has(out, "in the new round (recovery in place)"));
    }
    auto names = [](const std::set<int>& pids) {
      std::string out;
      for (int pid : pids) out += " " + std::to_string(pid);
      return out;
    };
    MESSAGE("survivors' worker pids before the cut:" << names(before) << "; after it:" << names(after));
    CHECK_MESSAGE(after == before, "the survivors' workers were replaced: before" << names(before) << ", after"
                                                                                    << names(after));
    CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  }
  const Resumed r = losses_after_resume(run_dir, agents[0]->output());
  const int resumed = r.step;
  const std::vector<double>& in_place = r.losses;
  const std::string from = run_dir + "/ckpt/step_" + std::to_string(resumed);
  hosts.heal(2);
  check_matches_two_hosts("in_place", "in place", from, resumed, in_place);
}

TEST_CASE("elastic 2:3: a node that comes back is admitted at the next round") {
  if (skip_without_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  TagGuard tag;
  const std::string dir = p.dir / "rejoin";
  auto log = [&](int i, int k) {
    return p.dir / ("rejoin_node" + std::to_string(i) + "_" + std::to_string(k) + ".log");
  };
  // Workers that say what they were told (world, mesh, the spec's dp and
  // grad_accum), then wait for the stop file. Rank 1 of round 1 also fails
  // (once) as soon as the rendezvous declares host 2 dead, as a worker whose
  // collective broke would: usually before its agent's next heartbeat hears
  // of the new round, so the agent must take that failure for the round
  // change it is and re-join (the job has no restarts to spend).
  dtrain::testing::write_file(
      p.dir / "rejoin_worker.sh",
      "echo \"worker rank $RANK of $WORLD_SIZE mesh $DTRAIN_MESH spec $(grep -E "
      "'^  (dp|grad_accum):' \"$DTRAIN_SPEC\" | tr -d ' ' | tr '\\n' ' ')\"\n"
      "while [ ! -e " + dir + "/stop ]; do\n"
      "  if [ \"$RANK\" = 1 ] && [ \"$WORLD_SIZE\" = 3 ] && [ ! -e " + dir + "/failed_once ] && [ ! -e " +
      dir + "/back ] && grep -q 'declared dead' " + log(0, 0) + "; then\n"
      "    touch " + dir + "/failed_once; echo 'rank 1: my collective broke'; exit 1\n"
      "  fi\n"
      "  sleep 0.02\n"
      "done\n");
  std::vector<std::string> sets = elastic_sets(dir);
  sets.insert(sets.end(), {"entrypoint=[/bin/sh, " + (p.dir / "rejoin_worker.sh") + "]",
                           "fault.kind=none", "fault.ms=0"});
  std::vector<std::unique_ptr<Child>> agents;
  start_three(agents, [&](int i) { return start_agent(i, p.dir / "spec.yaml", sets, log(i, 0), tag); });
  auto out0 = [&] { return agents[0]->output(); };
  REQUIRE_MESSAGE(wait_until([&] { return has(out0(), "round 1 closed"); }, 60), out0());
  REQUIRE_MESSAGE(has(out0(), "round 1 closed (restart 0): 3 nodes"), out0());
  hosts.cut(2);
  REQUIRE_MESSAGE(wait_until([&] { return has(out0(), "round 2 closed (restart 0): 2 nodes, world 2"); }, 60),
                  out0());
  REQUIRE_MESSAGE(agents[2]->wait(60), agents[2]->output());
  CHECK(agents[2]->exit_code() != 0);
  const std::string out1 = agents[1]->output();
  const bool failure_first = has(out1, "round 1 -> 2 (rank 1 failed after the round ended)");
  if (failure_first) CHECK_MESSAGE(has(out1, "rank 1: my collective broke"), out1);
  else CHECK_MESSAGE(has(out1, "round 1 -> 2; stopped this node's workers"), out1);
  MESSAGE("node 1 learnt of round 2 from " << std::string(failure_first ? "its worker's failure" : "a heartbeat"));
  dtrain::testing::write_file(dir + "/back", "");  // round 3's rank 1 must not fail
  hosts.heal(2);
  agents.push_back(start_agent(2, p.dir / "spec.yaml", sets, log(2, 1), tag));
  REQUIRE_MESSAGE(wait_until([&] { return has(out0(), "round 3 closed (restart 0): 3 nodes, world 3"); }, 60),
                  out0());
  CHECK(has(out0(), "round 3 opens: node '" + TestHosts::addr(2)));
  CHECK(has(out0(), "joins (elastic scale-up)"));
  // Every worker of round 3 has started before the stop file ends them.
  REQUIRE(wait_until([&] {
    return count(out0(), "worker rank 0 of 3") >= 2 &&
           count(agents[1]->output(), "worker rank 1 of 3") >= 2 &&
           count(agents[3]->output(), "worker rank 2 of 3") >= 1;
  }, 30));
  dtrain::testing::write_file(dir + "/stop", "");
  for (size_t i : {size_t(0), size_t(1), size_t(3)}) {
    INFO("agent " << i << ":\n" << agents[i]->output());
    REQUIRE(agents[i]->wait(60));
    CHECK(agents[i]->exit_code() == 0);
  }
  const std::string o0 = out0(), back = agents[3]->output();
  INFO("node 0:\n" << o0 << "\nnode 2 (back):\n" << back);
  CHECK(has(o0, "worker rank 0 of 3 mesh tp=1,cp=1,dp=3,pp=1,ep=1 spec dp:3 grad_accum:2"));
  CHECK(has(o0, "worker rank 0 of 2 mesh tp=1,cp=1,dp=2,pp=1,ep=1 spec dp:2 grad_accum:3"));
  CHECK(has(back, "worker rank 2 of 3 mesh tp=1,cp=1,dp=3,pp=1,ep=1 spec dp:3 grad_accum:2"));
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  for (const auto& a : agents)
    for (int pid : printed_pids(a->output())) CHECK_MESSAGE(!dtrain::testing::pid_alive(pid), "pid " << pid);
}

TEST_CASE("elastic 2:3: a cut host's agent re-joins when its link returns; the job ends on 3 nodes") {
  if (skip_without_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  TagGuard tag;
  const std::string run_dir = p.dir / "partition_rejoin";
  constexpr int kRejoinSteps = 100;
  std::vector<std::string> sets = elastic_sets(run_dir);
  // 100 steps of >= 100 ms: round 2 is still training when host 2 is back.
  // In place (the default, set here explicitly): the survivors' workers
  // train rounds 1, 2 and 3 in their processes. Round 3 once failed at its
  // first step with 'Connection closed by peer' (a wait on the SIGTERM poll
  // round 2 left in flight: fixed, each run has its own now). Once, in 10
  // runs, it hung at the round 2 -> 3 change (node 0's worker got the notice
  // and never continued): a chaos campaign showed the cause, a memory copy's
  // Gloo send to the lost node waiting the group's 300 s (no shut socket
  // wakes a send's wait); the round's end now aborts such waits.
  sets.insert(sets.end(), {"cluster.rendezvous.rejoin_timeout_s=120", "fault.ms=100",
                           "train.steps=" + std::to_string(kRejoinSteps), "cluster.recover_in_place=true"});
  std::vector<std::unique_ptr<Child>> agents;
  start_three(agents, [&](int i) {
    return start_agent(i, p.dir / "spec.yaml", sets, p.dir / ("partition_rejoin" + std::to_string(i) + ".log"), tag);
  });
  auto out = [&](int i) { return agents[size_t(i)]->output(); };
  REQUIRE_MESSAGE(wait_until([&] {
    return parity::read_metric(run_dir + "/metrics.jsonl", "loss").size() >= 6;
  }, 180), out(0));
  hosts.cut(2);
  // The order of events, each awaited: host 2's agent notices and keeps
  // trying; the survivors re-form on 2; the link returns; host 2 is admitted.
  REQUIRE_MESSAGE(wait_until([&] { return has(out(2), "re-joining for up to 120 s"); }, 60), out(2));
  REQUIRE_MESSAGE(wait_until([&] { return has(out(0), "round 2 closed (restart 0): 2 nodes"); }, 60), out(0));
  dtrain::testing::heal_and_finish(hosts, 2, agents, "round 3 closed (restart 0): 3 nodes");
  const std::string out0 = out(0), out2 = out(2);
  INFO("node 0:\n" << out0 << "\nnode 2:\n" << out2);
  CHECK(has(out0, "rendezvous round 1 closed (restart 0): 3 nodes"));
  CHECK(has(out0, "lost node 2: id '" + TestHosts::addr(2) + ":"));
  // Lost once, for the cut: not again after it re-joined (a join reply
  // held up on the connection that lived through the cut came after the
  // 3 heartbeats the rendezvous waits for).
  size_t deaths = 0;
  for (size_t at = 0; (at = out0.find("rendezvous: node '", at)) != std::string::npos; ++at)
    deaths += out0.compare(out0.find('\'', at + 19) + 2, 19, "missed 3 heartbeats") == 0 ? 1 : 0;
  CHECK(deaths == 1);
  CHECK(has(out2, "re-joined the rendezvous "));
  CHECK(has(out2, "round 3: node 2 of 3"));  // its workers ran in round 3
  // Round 3 resumed mid-run: it trained steps on 3 nodes again.
  const auto at = out0.rfind("resuming from step ");
  REQUIRE(at != std::string::npos);
  const int resumed = std::atoi(out0.c_str() + at + 19);
  CHECK(resumed < kRejoinSteps);
  // Exact resume: every step ran, and a step run again (after each round
  // change, from the last checkpoint, on another world with the same global
  // batch) has the loss of its first run.
  std::map<int, double> first;
  double worst = 0;
  int again = 0;
  for (auto [step, loss] : step_losses(run_dir + "/metrics.jsonl")) {
    if (!first.count(step)) {
      first[step] = loss;
      continue;
    }
    ++again;
    worst = std::max(worst, std::fabs(loss - first[step]) / std::max(std::fabs(first[step]), 1e-12));
  }
  MESSAGE("re-join: round 3 resumed from step " << resumed << " on 3 nodes; " << again
                                                << " step(s) run again, max loss rel diff vs their first run "
                                                << worst << " (tolerance " << parity::kLossRelTol << ")");
  CHECK(first.size() == size_t(kRejoinSteps));
  CHECK(first.rbegin()->first == kRejoinSteps);
  CHECK(worst <= parity::kLossRelTol);
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  for (const auto& a : agents)
    for (int pid : printed_pids(a->output())) CHECK_MESSAGE(!dtrain::testing::pid_alive(pid), "pid " << pid);
}

TEST_CASE("dp auto: dtrain topo and plan use nodes x procs_per_node; tp x pp not dividing it is refused") {
  dtrain::testing::TempDir dir;
  dtrain::testing::write_file(dir / "job.yaml",
                              "job: {name: auto}\ncluster: {nodes: 2, procs_per_node: 2}\nparallel: {dp: auto}\n"
                              "model: {layers: 3}\ntrain: {micro_batch: 2, global_batch: 16, grad_accum: auto}\n"
                              "data: {format: synthetic}\nlog: {dir: " + (dir / "run") + "}\n");
  const std::string dtrain = dtrain::testing::dtrain_bin();
  auto [code, out] = dtrain::testing::run_command({dtrain, "topo", dir / "job.yaml"}, dir / "topo.log", 30);
  CHECK_MESSAGE(code == 0, out);
  CHECK_MESSAGE(has(out, "mesh dp=4 tp=1 pp=1 ep=1, world 4, 2 nodes"), out);
  std::tie(code, out) = dtrain::testing::run_command({dtrain, "plan", dir / "job.yaml"}, dir / "plan.log", 30);
  CHECK_MESSAGE(code == 0, out);
  CHECK_MESSAGE(has(out, "world = dp(4, auto) x tp(1) x pp(1) = 4 ranks"), out);
  CHECK_MESSAGE(has(out, "GBS = micro_batch(2) x grad_accum(2, auto) x dp(4) = 16 sequences"), out);
  std::tie(code, out) = dtrain::testing::run_command(
      {dtrain, "topo", dir / "job.yaml", "--set", "parallel.pp=3"}, dir / "bad.log", 30);
  CHECK_MESSAGE(code == 2, out);
  CHECK_MESSAGE(has(out, "job.yaml:3:16: parallel.dp = auto: tp(1) x pp(3) = 3 does not divide the world "
                         "cluster.nodes(2) x cluster.procs_per_node(2) = 4; use cluster.procs_per_node 3"),
                out);
}
