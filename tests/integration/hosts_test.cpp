// Many hosts for real (docs/ARCHITECTURE.md, 'Test hosts: many machines on
// one'): agents in network namespaces made by scripts/testhosts, each with its
// own address and all with this machine's hostname (which maps to 127.x here, so
// a hostname handed out as MASTER_ADDR would point every node at itself). Cases
// skip, saying why, where namespaces cannot be made. Every process is an RAII
// Child with a TagGuard, and the hosts are torn down by TestHosts' destructor.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/parity.h"
#include "tests/support/skip.h"
#include "tests/support/test_hosts.h"

using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::TestHosts;
namespace parity = dtrain::testing::parity;

namespace {

constexpr int kRdzvPort = 29400;  // inside host 0's fresh namespace: free

// Skips the calling case (returns true) when test hosts cannot be made.
bool skip_without_hosts() {
  static const std::string why = TestHosts::unavailable_reason();
  if (why.empty()) return false;
  dtrain::testing::skip_case(dtrain::testing::SkipKind::test_hosts, "test hosts unavailable: " + why);
  return true;
}

struct HostsRun {
  parity::RunResult result;
  std::vector<std::string> outputs;  // per node
};

// One agent per test host (`dtrain launch --node-rank i --rdzv <host 0>:29400`
// inside host i), each with procs_per_node workers, on the parity fixture's
// spec: run dir <fixture>/<name> shared by all (one filesystem), checkpoint
// after the last step; every agent must exit 0.
HostsRun launch_on_hosts(const TestHosts& hosts, const std::string& name, int procs_per_node,
                         std::vector<std::string> sets) {
  auto& p = parity::Parity::get();
  TagGuard tag;
  const int n = hosts.size();
  const std::string run_dir = p.dir / name;
  sets.insert(sets.begin(),
              {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "checkpoint.every=0",
               "cluster.nodes=" + std::to_string(n),
               "cluster.procs_per_node=" + std::to_string(procs_per_node),
               "parallel.dp=" + std::to_string(n * procs_per_node),
               "cluster.rendezvous.join_timeout_s=60", "cluster.rendezvous.heartbeat_s=0.5"});
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml",
                                     "--node-rank", std::to_string(i), "--rdzv",
                                     TestHosts::addr(0) + ":" + std::to_string(kRdzvPort)};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    agents.push_back(std::make_unique<Child>(
        TestHosts::in_host(i, argv), p.dir / (name + "_node" + std::to_string(i) + ".log"),
        std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=hosts-test"}));
  }
  HostsRun run;
  for (int i = 0; i < n; ++i) {
    Child& a = *agents[static_cast<size_t>(i)];
    const bool ended = a.wait(300);
    run.outputs.push_back(a.output());
    INFO("node " << i << " output:\n" << a.output());
    REQUIRE(ended);
    REQUIRE(a.exit_code() == 0);
  }
  parity::RunResult& r = run.result;
  r.output = run.outputs.front();
  r.losses = parity::read_metric(run_dir + "/metrics.jsonl", "loss");
  r.grad_norms = parity::read_metric(run_dir + "/metrics.jsonl", "grad_norm");
  REQUIRE(r.losses.size() == size_t(parity::kSteps));
  REQUIRE(dtrain::testing::read_latest(run_dir + "/ckpt") == "step_" + std::to_string(parity::kSteps));
  r.params = dtrain::testing::read_checkpoint_params(run_dir + "/ckpt", p.dir.path());
  // No process of the job outlives its agents.
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
  return run;
}

}  // namespace

TEST_CASE("3 test hosts x 1 worker (one shared hostname, no DNS) match 1 host x 3 workers") {
  if (skip_without_hosts()) return;
  const parity::RunResult one_host = parity::launch(parity::Parity::get().dir, "one_host_dp3",
                                                    parity::ranks(3, 4));
  TestHosts hosts(3);
  const HostsRun three = launch_on_hosts(hosts, "three_hosts", 1, {"train.micro_batch=4"});
  const HostsRun control =
      launch_on_hosts(hosts, "three_hosts_no_sync", 1, {"train.micro_batch=4", "fault.kind=no_grad_sync"});
  // The workers were told an address, never the shared hostname.
  CHECK_MESSAGE(three.outputs[1].find("master " + TestHosts::addr(0) + ":") != std::string::npos,
                three.outputs[1]);
  for (int i = 0; i < 3; ++i)
    CHECK_MESSAGE(three.outputs[0].find("node " + std::to_string(i) + ": " + TestHosts::addr(i)) !=
                      std::string::npos,
                  three.outputs[0]);
  parity::compare("3 test hosts x 1 worker vs 1 host x 3 workers", three.result, control.result,
                  one_host);
}

TEST_CASE("--advertise-addr that is not an address of this host: refused, naming it and the fix") {
  dtrain::testing::TempDir dir;
  dtrain::testing::write_file(dir / "job.yaml",
                              "job: {name: adv}\ncluster: {nodes: 2, procs_per_node: 1}\nparallel: {dp: 2}\n"
                              "log: {dir: " + (dir / "run") + "}\nentrypoint: [/bin/true]\n");
  auto [code, out] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "launch", dir / "job.yaml", "--node-rank", "1", "--rdzv",
       "127.0.0.1:1", "--advertise-addr", "203.0.113.254"},
      dir / "out.log", 30, {"DTRAIN_TOKEN=adv"});
  CHECK_MESSAGE(code == 2, out);
  CHECK_MESSAGE(out.find("--advertise-addr = 203.0.113.254 is not an address of this host") !=
                    std::string::npos,
                out);
  CHECK_MESSAGE(out.find("127.0.0.1 (lo)") != std::string::npos, out);
  auto [code2, out2] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "launch", dir / "job.yaml", "--node-rank", "1", "--rdzv",
       "127.0.0.1:1", "--set", "cluster.rendezvous.advertise_addr=not-an-ip"},
      dir / "out2.log", 30, {"DTRAIN_TOKEN=adv"});
  CHECK_MESSAGE(code2 == 2, out2);
  CHECK_MESSAGE(out2.find("cluster.rendezvous.advertise_addr = 'not-an-ip' is not a numeric IP "
                          "address") != std::string::npos,
                out2);
}

namespace {

// scripts/testslurm up N ... down (inside TestHosts, which owns the hosts).
struct SlurmCluster {
  explicit SlurmCluster(int n) {
    auto [code, out] = dtrain::testing::run_command(
        {dtrain::testing::source_dir() + "/scripts/testslurm", "up", std::to_string(n)},
        "/tmp/dtrain-testslurm-up.log", 90);
    std::remove("/tmp/dtrain-testslurm-up.log");
    if (code != 0) {
      down();
      FAIL("scripts/testslurm up failed:\n" << out);
    }
  }
  ~SlurmCluster() { down(); }
  static void down() {
    dtrain::testing::run_command({dtrain::testing::source_dir() + "/scripts/testslurm", "down"},
                                 "/tmp/dtrain-testslurm-down.log", 60);
    std::remove("/tmp/dtrain-testslurm-down.log");
  }
  static std::string check() {
    auto [code, out] = dtrain::testing::run_command(
        {dtrain::testing::source_dir() + "/scripts/testslurm", "check"},
        "/tmp/dtrain-testslurm-check.log", 30);
    std::remove("/tmp/dtrain-testslurm-check.log");
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return code == 0 ? "" : out;
  }
};

}  // namespace

TEST_CASE("SLURM: sbatch examples/slurm/train.sbatch trains on 2 test hosts x 2 workers") {
  if (skip_without_hosts()) return;
  if (const std::string why = SlurmCluster::check(); !why.empty()) {
    DTRAIN_SKIP(slurm, "no SLURM here: " << why);
  }
  auto& p = parity::Parity::get();
  TestHosts hosts(2);
  SlurmCluster slurm(2);
  TagGuard tag;
  const std::string run_dir = p.dir / "slurm";
  std::vector<std::string> argv = {dtrain::testing::source_dir() + "/scripts/testslurm", "exec",
                                   "sbatch", "--wait", "--chdir=" + p.dir.path(),
                                   "--output=" + (p.dir / "slurm-job.out"),
                                   dtrain::testing::source_dir() + "/examples/slurm/train.sbatch"};
  for (const std::string& s : std::vector<std::string>{"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "cluster.procs_per_node=2",
        "parallel.dp=4", "train.micro_batch=2", "cluster.rendezvous.endpoint=127.0.0.1:29400",
        "cluster.rendezvous.heartbeat_s=0.5"})
    argv.insert(argv.end(), {"--set", s});
  auto [code, out] = dtrain::testing::run_command(
      argv, p.dir / "sbatch.log", 300,
      {tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_SPEC_FILE=" + (p.dir / "spec.yaml"),
       "DTRAIN_BIN=" + dtrain::testing::dtrain_bin()});
  const std::string job_out = dtrain::testing::read_file(p.dir / "slurm-job.out");
  INFO("sbatch:\n" << out << "\njob output:\n" << job_out);
  REQUIRE(code == 0);
  const auto losses = parity::read_metric(run_dir + "/metrics.jsonl", "loss");
  REQUIRE(losses.size() == size_t(parity::kSteps));
  MESSAGE("SLURM 2 nodes x 2 workers: loss " << losses.front() << " -> " << losses.back());
  CHECK(losses.back() < losses.front() - 0.1);
  CHECK(job_out.find("node 1: " + TestHosts::addr(1)) != std::string::npos);
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
}

TEST_CASE("partition: host 2's link cut mid-run; the survivors name it after 3 missed heartbeats") {
  if (skip_without_hosts()) return;
  auto& p = parity::Parity::get();
  TestHosts hosts(3);
  TagGuard tag;
  const double heartbeat = 0.5;
  const std::string run_dir = p.dir / "partition";
  std::vector<std::string> sets = {
      "log.dir=" + run_dir, "cluster.nodes=3", "cluster.procs_per_node=1", "parallel.dp=3",
      "train.micro_batch=4", "train.steps=400", "cluster.grace_s=1",
      "cluster.rendezvous.join_timeout_s=4", "cluster.rendezvous.rejoin_timeout_s=1",
      "cluster.rendezvous.heartbeat_s=" + std::to_string(heartbeat)};
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml",
                                     "--node-rank", std::to_string(i), "--rdzv",
                                     TestHosts::addr(0) + ":" + std::to_string(kRdzvPort)};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    agents.push_back(std::make_unique<Child>(
        TestHosts::in_host(i, argv), p.dir / ("partition_node" + std::to_string(i) + ".log"),
        std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=hosts-test"}));
  }
  // Cut once training is past step 6.
  bool trained = false;
  for (int k = 0; k < 1500 && !trained; ++k) {
    trained = parity::read_metric(run_dir + "/metrics.jsonl", "loss").size() >= 6;
    if (!trained) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(trained, agents[0]->output());
  hosts.cut(2);
  for (int i = 0; i < 3; ++i) {
    INFO("node " << i << ":\n" << agents[static_cast<size_t>(i)]->output());
    REQUIRE(agents[static_cast<size_t>(i)]->wait(60));
    CHECK(agents[static_cast<size_t>(i)]->exit_code() != 0);  // nodes: 3 cannot re-form on 2
  }
  const std::string lost = "lost node 2: id '" + TestHosts::addr(2) + ":";
  for (int i = 0; i < 2; ++i) {
    const std::string out = agents[static_cast<size_t>(i)]->output();
    INFO("survivor " << i << ":\n" << out);
    CHECK(out.find(lost) != std::string::npos);
    CHECK(out.find("address " + TestHosts::addr(2) + ", hostname ") != std::string::npos);
  }
  // When the rendezvous declared it dead: its own clock, in its message.
  const std::string out0 = agents[0]->output();
  const auto at = out0.find("last heartbeat ");
  REQUIRE(at != std::string::npos);
  const double age = std::strtod(out0.c_str() + at + 15, nullptr);
  MESSAGE("partition: host 2 declared dead " << age << " s after its last heartbeat (heartbeat "
                                             << heartbeat << " s, limit 3 beats)");
  // Not before 3 missed beats; how soon after is the rendezvous's logic, checked
  // on an injected clock (rendezvous_round_test.cpp), not on a loaded machine.
  CHECK(age >= 3 * heartbeat);
  CHECK(agents[2]->output().find("lost the rendezvous server") != std::string::npos);
  CHECK(agents[2]->output().find("gave up re-joining after") != std::string::npos);
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
}
