// The root-cause chain end to end: a builtin worker that throws (fault.kind
// raise) leaves its error file, and the root-cause block of every node (2
// agents on loopback) names the rank, the step and the message; and workers
// never outlive their agent: after SIGKILL (the worker watch) or SIGTERM,
// every worker and everything it forked, in its process group or another of
// its session, is gone, checked by PID.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/child.h"
#include "tests/support/parity.h"

using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::TempDir;
namespace parity = dtrain::testing::parity;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Alive and not a zombie (a zombie is dead; only its parent's wait is missing).
bool running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = dtrain::testing::read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

bool wait_for(const std::function<bool()>& pred, double timeout_s) {
  const auto start = Clock::now();
  while (seconds_since(start) < timeout_s) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

std::vector<pid_t> pids_in(const std::string& path) {
  std::vector<pid_t> out;
  std::istringstream in(dtrain::testing::read_file(path));
  for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
  return out;
}

}  // namespace

TEST_CASE("raise in step 3 on rank 1 of 2 nodes: its error file, and every node's block names rank, step and message") {
  auto& p = parity::Parity::get();
  TagGuard tag;
  const std::string run_dir = p.dir / "raise";
  const std::string rdzv = "127.0.0.1:" + std::to_string(dtrain::testing::free_port());
  const std::vector<std::string> sets = {
      "log.dir=" + run_dir, "cluster.nodes=2", "cluster.procs_per_node=1", "parallel.dp=2",
      "train.steps=6", "fault.kind=raise", "fault.rank=1", "fault.step=3",
      "cluster.max_restarts=0", "cluster.grace_s=1", "cluster.rendezvous.heartbeat_s=0.5",
      "cluster.rendezvous.join_timeout_s=60"};
  std::vector<std::unique_ptr<Child>> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml",
                                     "--node-rank", std::to_string(node), "--rdzv", rdzv,
                                     "--hostname", "host" + std::to_string(node)};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    agents.push_back(std::make_unique<Child>(
        argv, p.dir / ("raise_node" + std::to_string(node) + ".log"),
        std::vector<std::string>{tag.env(), "DTRAIN_NO_REBUILD=1", "DTRAIN_TOKEN=root-cause-test"}));
  }
  std::vector<std::string> out;
  for (auto& a : agents) {
    const bool ended = a->wait(120);
    out.push_back(a->output());
    INFO("node output:\n" << a->output());
    REQUIRE(ended);
    CHECK(a->exit_code() != 0);
  }
  INFO("node 0:\n" << out[0] << "\nnode 1:\n" << out[1]);

  // The worker's own record (torchelastic's layout).
  const auto file = nlohmann::json::parse(dtrain::testing::read_file(run_dir + "/error_rank_1.json"));
  const std::string message = file["message"]["message"];
  CHECK(message == "fault.kind = raise: rank 1 throws in step 3 on purpose (chaos testing)");
  CHECK(file["message"]["extraInfo"]["rank"] == 1);
  CHECK(file["message"]["extraInfo"]["step"] == 3);

  // Node 1 (rank 1's): its own block, with the host, rank, step, exit and message.
  CHECK(out[1].find("Root cause (first failure)") != std::string::npos);
  CHECK(out[1].find("host       : host1 (127.0.0.1)") != std::string::npos);
  CHECK(out[1].find("rank       : 1 (local rank 0)") != std::string::npos);
  CHECK(out[1].find("step       : 3 (the step it failed in)") != std::string::npos);
  CHECK(out[1].find("exit       : exit code 1") != std::string::npos);
  CHECK(out[1].find("    " + message) != std::string::npos);
  // Node 0: the same failure as the rendezvous tells it (its own rank 0 broke on it).
  CHECK(out[0].find("Root cause (as the rendezvous tells every node)") != std::string::npos);
  CHECK(out[0].find("rank 1 (local rank 0) on node 1 (127.0.0.1, hostname host1, id '127.0.0.1:") !=
        std::string::npos);
  CHECK(out[0].find("failed: exit code 1: in step 3: " + message) != std::string::npos);
  CHECK(out[0].find("Root cause (first failure)") == std::string::npos);
  CHECK(dtrain::testing::tagged_pids(tag.tag()).empty());
}

namespace {

// One agent, 2 workers whose entrypoint is a shell: each forks `sleep 300`
// (in the shell's process group) and a Python that moves to a process group of its
// own and ignores SIGTERM (only a SIGKILL of the session ends it). `sig` goes
// to the agent; every PID of the job must then be gone (the waits are hang
// guards: how soon is not claimed on a shared machine).
void check_nothing_outlives(int sig) {
  const std::string py = dtrain::testing::python();
  REQUIRE_MESSAGE(!py.empty(), "needs the project's Python (DTRAIN_PYTHON)");
  TempDir dir;
  TagGuard tag;
  const double grace = 1.0;
  // $$ is the worker (the shell), $! each child; the Python writes its own pid.
  dtrain::testing::write_file(
      dir / "worker.sh",
      "echo $$ >> " + dir.path() + "/pids.$RANK\n"
      "sleep 300 &\n"
      "echo $! >> " + dir.path() + "/pids.$RANK\n" +
      py + " -c 'import os, signal, sys, time; os.setpgid(0, 0); "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(300)' " +
      dir.path() + "/py.$RANK &\n"
      "wait\n");
  dtrain::testing::write_file(dir / "job.yaml",
                              "job: {name: outlive}\ncluster: {nodes: 1, procs_per_node: 2, grace_s: 1}\n"
                              "parallel: {dp: 2}\nlog: {dir: " + (dir / "run") + "}\n"
                              "entrypoint: [sh, " + (dir / "worker.sh") + "]\n");
  Child agent({dtrain::testing::dtrain_bin(), "launch", dir / "job.yaml"}, dir / "agent.out",
              {tag.env()});
  auto all_started = [&] {
    for (int r = 0; r < 2; ++r)
      if (pids_in(dir / ("pids." + std::to_string(r))).size() < 2 ||
          pids_in(dir / ("py." + std::to_string(r))).empty())
        return false;
    return true;
  };
  REQUIRE_MESSAGE(wait_for(all_started, 30), agent.output());
  std::set<pid_t> job;  // workers, their children, and the agent's watcher
  for (int r = 0; r < 2; ++r) {
    for (pid_t pid : pids_in(dir / ("pids." + std::to_string(r)))) job.insert(pid);
    for (pid_t pid : pids_in(dir / ("py." + std::to_string(r)))) job.insert(pid);
  }
  for (pid_t pid : dtrain::testing::tagged_pids(tag.tag())) job.insert(pid);
  job.erase(agent.pid());
  REQUIRE(job.size() >= 7);  // 2 shells, 2 sleeps, 2 Pythons (moved groups), the watcher
  for (pid_t pid : job) REQUIRE_MESSAGE(running(pid), "pid " << pid << " before the signal");

  const auto sent = Clock::now();
  agent.signal(sig);
  // Hang guards only (no claim on speed): the agent ends, then every process of the job.
  REQUIRE_MESSAGE(agent.wait(60), agent.output());
  const bool gone = wait_for([&] {
    for (pid_t pid : job)
      if (running(pid)) return false;
    return true;
  }, 60);
  const double took = seconds_since(sent);
  std::string left;
  for (pid_t pid : job)
    if (running(pid)) left += " " + std::to_string(pid);
  MESSAGE(job.size() << " processes of the job gone " << took << " s after " << std::string(strsignal(sig))
                     << " to the agent (grace " << grace << " s)" << (left.empty() ? "" : "; left:" + left));
  CHECK_MESSAGE(gone, agent.output());
  if (sig == SIGKILL)
    CHECK(agent.output().find("the agent (pid " + std::to_string(agent.pid()) + ") is gone") !=
          std::string::npos);
}

}  // namespace

TEST_CASE("no worker outlives its agent, whatever it forked: SIGKILL and SIGTERM to dtrain") {
  SUBCASE("SIGKILL (the worker watch stops them)") { check_nothing_outlives(SIGKILL); }
  SUBCASE("SIGTERM (the agent stops their sessions)") { check_nothing_outlives(SIGTERM); }
}
