// Integration tests of `dtrain launch`: the real dtrain binary on loopback
// running tests/env_report (or Python + torch) as workers. Covers the env
// contract, 2 agents vs `dtrain topo`, 2 agents placed by SLURM variables,
// gloo all-reduce, refusals, restarts, root cause, signals and a killed agent. Every process is an RAII Child
// tagged with a TagGuard, so no path leaves a process behind.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <sstream>

#include "tests/support/child.h"

using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::wait_until;
using dtrain::testing::TempDir;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

std::string env_report() { return dtrain::testing::binary_dir() + "/tests/env_report"; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// One test's world: a temp dir (spec, log.dir, env.jsonl), a tag for every
// process it starts, and helpers to run dtrain in it.
struct Job {
  TempDir dir;
  TagGuard tag;
  std::vector<std::unique_ptr<Child>> children;

  // YAML for a job whose workers run `argv` (env_report by default).
  std::string spec(const std::string& cluster, const std::string& parallel,
                   std::vector<std::string> argv = {}) {
    if (argv.empty()) argv = {env_report(), "--dir", dir.path()};
    std::string list;
    for (const auto& a : argv) list += (list.empty() ? "'" : ", '") + a + "'";
    std::string path = dir / "job.yaml";
    dtrain::testing::write_file(
        path, "job: {name: itest}\ncluster: {" + cluster + "}\nparallel: {" + parallel +
                  "}\nlog: {dir: " + (dir / "run") + "}\nentrypoint: [" + list + "]\n");
    return path;
  }

  std::vector<std::string> env(std::vector<std::string> extra = {}) const {
    extra.push_back(tag.env());
    return extra;
  }

  Child& start(std::vector<std::string> args, const std::string& name,
               std::vector<std::string> extra_env = {}) {
    args.insert(args.begin(), dtrain::testing::dtrain_bin());
    children.push_back(std::make_unique<Child>(args, dir / (name + ".out"), env(extra_env)));
    return *children.back();
  }

  // Run to the end; CHECKs it ended within timeout_s.
  std::pair<int, std::string> run(std::vector<std::string> args, double timeout_s = 60,
                                  std::vector<std::string> extra_env = {}) {
    Child& c = start(std::move(args), "run" + std::to_string(children.size()), extra_env);
    bool ended = c.wait(timeout_s);
    CHECK_MESSAGE(ended, "dtrain did not end within ", timeout_s, " s:\n", c.output());
    return {ended ? c.exit_code() : -1, c.output()};
  }

  // `dtrain rendezvous` on a free loopback port; returns the port.
  int rendezvous(const std::string& spec_path, std::vector<std::string> extra_env = {}) {
    int port = free_port();
    Child& c = start({"rendezvous", spec_path, "--host", "127.0.0.1", "--port",
                      std::to_string(port)},
                     "rendezvous", extra_env);
    REQUIRE_MESSAGE(wait_until([&] { return c.output().find("listening") != std::string::npos; },
                               20),
                    "rendezvous did not start:\n", c.output());
    return port;
  }

  std::vector<json> reports() const {
    std::vector<json> out;
    std::istringstream in(dtrain::testing::read_file(dir / "env.jsonl"));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(json::parse(line));
    return out;
  }
};

int as_int(const json& report, const char* key) { return std::stoi(report[key].get<std::string>()); }

}  // namespace

TEST_CASE("1 node x 4 workers: env contract, MASTER reachable, logs, --ranks") {
  Job job;
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, grace_s: 1", "dp: 4",
                              {env_report(), "--dir", job.dir.path(), "--check-master"});
  auto [code, out] = job.run({"launch", spec, "--ranks", "0,3"});
  REQUIRE_MESSAGE(code == 0, out);
  auto reports = job.reports();
  REQUIRE(reports.size() == 4);
  std::set<int> ranks;
  std::string run_dir = job.dir / "run";
  for (const auto& r : reports) {
    int rank = as_int(r, "RANK");
    ranks.insert(rank);
    CHECK(as_int(r, "WORLD_SIZE") == 4);
    CHECK(as_int(r, "LOCAL_RANK") == rank);
    CHECK(as_int(r, "LOCAL_WORLD_SIZE") == 4);
    CHECK(as_int(r, "GROUP_RANK") == 0);
    CHECK(as_int(r, "ROLE_RANK") == rank);
    CHECK(as_int(r, "DTRAIN_RESTART") == 0);
    CHECK(r["MASTER_ADDR"] == "127.0.0.1");
    CHECK(r["master_ok"] == true);  // rank 0 bound MASTER_PORT, the others connected
    CHECK(r["DTRAIN_MESH"] == "tp=1,cp=1,dp=4,pp=1,ep=1");
    CHECK(r["DTRAIN_COORD"] == "tp=0,cp=0,dp=" + std::to_string(rank) + ",pp=0,ep=0");
    CHECK(r["DTRAIN_RUN_DIR"] == run_dir);
    CHECK(r["DTRAIN_SPEC"] == run_dir + "/spec.resolved.yaml");
    CHECK(r["DTRAIN_ERROR_FILE"] == run_dir + "/error_rank_" + std::to_string(rank) + ".json");
    CHECK(as_int(r, "OMP_NUM_THREADS") >= 1);
    CHECK(r["pgid"] == r["pid"]);  // each worker leads its own process group
    CHECK(r["sid"] == r["pid"]);   // ... and its own session, as torchrun's workers
    CHECK(dtrain::testing::read_file(run_dir + "/rank_" + std::to_string(rank) + ".log")
              .find("env_report rank " + std::to_string(rank)) != std::string::npos);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(dtrain::testing::read_file(run_dir + "/spec.resolved.yaml").find("itest") !=
        std::string::npos);
  CHECK(out.find("[rank 0] env_report rank 0") != std::string::npos);
  CHECK(out.find("[rank 3] env_report rank 3") != std::string::npos);
  CHECK(out.find("[rank 1]") == std::string::npos);  // filtered by --ranks 0,3
  CHECK(out.find("[rank 2]") == std::string::npos);
}

TEST_CASE("2 agents x 4 workers through `dtrain rendezvous`: ranks and coords equal dtrain topo") {
  Job job;
  std::string spec = job.spec("nodes: 2, procs_per_node: 4, grace_s: 1, "
                              "rendezvous: {join_timeout_s: 30, heartbeat_s: 0.5}",
                              "dp: 2, tp: 2, pp: 2");
  std::vector<std::string> token = {"DTRAIN_TOKEN=itest-secret"};
  int port = job.rendezvous(spec, token);
  std::string rdzv = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> set = {"--set", "cluster.topology.nvlink_domain=2"};
  auto args = [&](int node) {
    std::vector<std::string> a = {"launch", spec, "--node-rank", std::to_string(node), "--rdzv",
                                  rdzv};
    a.insert(a.end(), set.begin(), set.end());
    return a;
  };
  Child& a0 = job.start(args(0), "agent0", token);
  Child& a1 = job.start(args(1), "agent1", token);
  REQUIRE_MESSAGE(a0.wait(60), a0.output());
  REQUIRE_MESSAGE(a1.wait(60), a1.output());
  REQUIRE_MESSAGE(a0.exit_code() == 0, a0.output());
  REQUIRE_MESSAGE(a1.exit_code() == 0, a1.output());

  auto [topo_code, topo_out] =
      job.run({"topo", spec, "--set", "cluster.topology.nvlink_domain=2", "--format", "json"});
  REQUIRE_MESSAGE(topo_code == 0, topo_out);
  json topo = json::parse(topo_out.substr(topo_out.find('{')));
  auto reports = job.reports();
  REQUIRE(reports.size() == 8);
  std::set<int> seen;
  for (const auto& r : reports) {
    int rank = as_int(r, "RANK");
    seen.insert(rank);
    const json& t = topo["ranks"][rank];
    REQUIRE(t["rank"] == rank);
    CHECK(as_int(r, "GROUP_RANK") == t["node"].get<int>());
    CHECK(as_int(r, "LOCAL_RANK") == t["device"].get<int>());
    CHECK(as_int(r, "WORLD_SIZE") == 8);
    CHECK(as_int(r, "LOCAL_WORLD_SIZE") == 4);
    std::string coord = "tp=" + std::to_string(t["tp"].get<int>()) + ",cp=0" +
                        ",dp=" + std::to_string(t["dp"].get<int>()) +
                        ",pp=" + std::to_string(t["pp"].get<int>()) +
                        ",ep=" + std::to_string(t["ep"].get<int>());
    CHECK(r["DTRAIN_COORD"] == coord);
    CHECK(r["DTRAIN_MESH"] == "tp=2,cp=1,dp=2,pp=2,ep=1");
  }
  CHECK(seen.size() == 8);
}

TEST_CASE("PyTorch gloo all-reduce across 4 dtrain workers (env://)") {
  const std::string py = dtrain::testing::python();
  REQUIRE_MESSAGE(!py.empty(), "no Python with torch was found at configure time: run scripts/install-deps");
  auto [has_torch, why] =
      dtrain::testing::run_command({py, "-c", "import torch.distributed"}, "/dev/null", 120);
  REQUIRE_MESSAGE(has_torch == 0, py << " cannot import torch.distributed: " << why);
  Job job;
  std::string script = dtrain::testing::source_dir() + "/tests/support/allreduce_check.py";
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, grace_s: 1", "dp: 4",
                              {py, script});
  auto [code, out] = job.run({"launch", spec}, 240);
  CHECK_MESSAGE(code == 0, out);
  CHECK_MESSAGE(count(out, "sum 10 expected 10 OK") == 4, out);
}

TEST_CASE("wrong token: refused with a message, no worker started") {
  Job job;
  std::string spec = job.spec("nodes: 2, procs_per_node: 2, rendezvous: {join_timeout_s: 10}",
                              "dp: 4");
  int port = job.rendezvous(spec, {"DTRAIN_TOKEN=the-right-one"});
  auto [code, out] = job.run({"launch", spec, "--node-rank", "1", "--rdzv",
                              "127.0.0.1:" + std::to_string(port)},
                             30, {"DTRAIN_TOKEN=a-wrong-one"});
  CHECK(code != 0);
  CHECK_MESSAGE(out.find("token") != std::string::npos, out);
  CHECK(job.reports().empty());
}

TEST_CASE("join timeout: says how many nodes of how many joined") {
  Job job;
  std::string spec = job.spec("nodes: 2, procs_per_node: 2, rendezvous: {join_timeout_s: 2}",
                              "dp: 4");
  auto [code, out] = job.run({"launch", spec, "--node-rank", "0", "--rdzv",
                              "127.0.0.1:" + std::to_string(free_port())},
                             30, {"DTRAIN_TOKEN=t"});
  CHECK(code != 0);
  CHECK_MESSAGE(out.find("1 of 2") != std::string::npos, out);
  CHECK(job.reports().empty());
}

TEST_CASE("a worker that fails on its first run: restart, success, DTRAIN_RESTART=1") {
  Job job;
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, max_restarts: 1, grace_s: 1", "dp: 4",
                              {env_report(), "--dir", job.dir.path(), "--fail-restart", "0",
                               "--fail-rank", "2"});
  auto [code, out] = job.run({"launch", spec});
  CHECK_MESSAGE(code == 0, out);
  auto reports = job.reports();
  int second_run = 0;
  for (const auto& r : reports)
    if (as_int(r, "DTRAIN_RESTART") == 1) {
      ++second_run;
      CHECK(as_int(r, "TORCHELASTIC_RESTART_COUNT") == 1);
    }
  CHECK(second_run == 4);
  CHECK(out.find("Root cause") == std::string::npos);
}

TEST_CASE("failing every time with max_restarts 2: non-zero after exactly 3 runs, root cause") {
  Job job;
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, max_restarts: 2, grace_s: 1", "dp: 4",
                              {env_report(), "--dir", job.dir.path(), "--fail-always",
                               "--fail-rank", "2", "--error-message", "boom 42"});
  auto [code, out] = job.run({"launch", spec});
  CHECK(code == 1);
  std::set<int> restarts;
  int rank2_runs = 0;
  for (const auto& r : job.reports()) {
    restarts.insert(as_int(r, "DTRAIN_RESTART"));
    rank2_runs += as_int(r, "RANK") == 2;
  }
  CHECK(restarts == std::set<int>{0, 1, 2});
  CHECK(rank2_runs == 3);
  CHECK_MESSAGE(count(out, "Root cause") == 1, out);
  CHECK(out.find("rank       : 2 (local rank 2)") != std::string::npos);
  CHECK(out.find("exit code 1") != std::string::npos);
  CHECK(out.find("boom 42") != std::string::npos);  // the worker's error file
  CHECK(out.find("| env_report rank 2: failing on purpose") != std::string::npos);  // log tail
}

TEST_CASE("SIGKILL one worker: the others are stopped, root cause says SIGKILL") {
  Job job;
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, grace_s: 2", "dp: 4",
                              {env_report(), "--dir", job.dir.path(), "--sleep", "60"});
  Child& dtrain = job.start({"launch", spec}, "dtrain");
  REQUIRE_MESSAGE(wait_until([&] { return job.reports().size() == 4; }, 30), dtrain.output());
  auto reports = job.reports();
  std::vector<pid_t> pids;
  pid_t victim = 0;
  for (const auto& r : reports) {
    pids.push_back(r["pid"].get<int>());
    if (as_int(r, "RANK") == 1) victim = r["pid"].get<int>();
  }
  ::kill(victim, SIGKILL);
  REQUIRE_MESSAGE(dtrain.wait(10), dtrain.output());
  CHECK(dtrain.exit_code() == 128 + SIGKILL);
  for (pid_t pid : pids) CHECK_FALSE(dtrain::testing::pid_alive(pid));
  std::string out = dtrain.output();
  CHECK_MESSAGE(out.find("signal 9 (SIGKILL)") != std::string::npos, out);
  CHECK(out.find("rank       : 1 (local rank 1)") != std::string::npos);
}

TEST_CASE("SIGTERM to dtrain: every worker is gone, by SIGTERM or by SIGKILL after the grace period") {
  Job job;
  const double grace = 2.0;
  std::string spec = job.spec("nodes: 1, procs_per_node: 4, grace_s: 2", "dp: 4",
                              {env_report(), "--dir", job.dir.path(), "--sleep", "60",
                               "--ignore-term", "3"});  // rank 3 needs the SIGKILL
  Child& dtrain = job.start({"launch", spec}, "dtrain");
  REQUIRE_MESSAGE(wait_until([&] { return job.reports().size() == 4; }, 30), dtrain.output());
  std::vector<pid_t> pids;
  for (const auto& r : job.reports()) pids.push_back(r["pid"].get<int>());
  auto sent = Clock::now();
  dtrain.signal(SIGTERM);
  REQUIRE_MESSAGE(dtrain.wait(60), dtrain.output());  // a hang guard, no claim on speed
  double took = seconds_since(sent);
  MESSAGE("dtrain exited ", took, " s after SIGTERM (grace ", grace, " s)");
  // The order of events, not a time bound: ranks 0-2 stopped at the SIGTERM,
  // rank 3 (ignoring it) was SIGKILLed once the grace period was over.
  CHECK(took >= grace);
  const std::string out = dtrain.output();
  for (int r = 0; r < 4; ++r) {
    const std::string rank = "rank " + std::to_string(r) + " (local rank " + std::to_string(r) + ", pid ";
    const auto at = out.find(rank);
    REQUIRE_MESSAGE(at != std::string::npos, out);
    const std::string line = out.substr(at, out.find('\n', at) - at);
    const char* want = r == 3 ? "stopped: signal 9 (SIGKILL)" : "stopped: signal 15 (SIGTERM)";
    CHECK_MESSAGE(line.find(want) != std::string::npos, line);
  }
  CHECK(dtrain.exit_code() == 128 + SIGTERM);
  for (pid_t pid : pids) CHECK_FALSE(dtrain::testing::pid_alive(pid));
}

// The survivor stops its workers and gives up; the killed agent's workers
// are stopped by its worker watch (launcher/worker_watch.h).
static void check_survivor_after_kill(bool kill_node0_with_server) {
  Job job;
  const double heartbeat = 0.5;
  // rejoin_timeout_s: when node 0 (and the rendezvous with it) is gone, the
  // survivor re-joins this long before it gives up.
  std::string spec = job.spec("nodes: 2, procs_per_node: 2, grace_s: 1, "
                              "rendezvous: {join_timeout_s: 4, heartbeat_s: 0.5, rejoin_timeout_s: 1}",
                              "dp: 4", {env_report(), "--dir", job.dir.path(), "--sleep", "60"});
  std::vector<std::string> token = {"DTRAIN_TOKEN=itest"};
  int port = kill_node0_with_server ? free_port() : job.rendezvous(spec, token);
  std::string rdzv = "127.0.0.1:" + std::to_string(port);
  Child& a0 = job.start({"launch", spec, "--node-rank", "0", "--rdzv", rdzv}, "agent0", token);
  if (kill_node0_with_server)
    REQUIRE(wait_until([&] { return a0.output().find("listening") != std::string::npos; }, 20));
  Child& a1 = job.start({"launch", spec, "--node-rank", "1", "--rdzv", rdzv}, "agent1", token);
  REQUIRE_MESSAGE(wait_until([&] { return job.reports().size() == 4; }, 30), a1.output());
  Child& victim = kill_node0_with_server ? a0 : a1;
  Child& survivor = kill_node0_with_server ? a1 : a0;
  int survivor_node = kill_node0_with_server ? 1 : 0;
  std::vector<pid_t> survivor_pids, victim_pids;
  for (const auto& r : job.reports())
    (as_int(r, "GROUP_RANK") == survivor_node ? survivor_pids : victim_pids)
        .push_back(r["pid"].get<int>());
  REQUIRE(survivor_pids.size() == 2);
  REQUIRE(victim_pids.size() == 2);
  auto killed = Clock::now();
  victim.signal(SIGKILL);
  bool stopped = wait_until([&] {
    return std::none_of(survivor_pids.begin(), survivor_pids.end(), dtrain::testing::pid_alive);
  }, 15);
  double took = seconds_since(killed);
  MESSAGE("survivor stopped its workers ", took, " s after the kill (heartbeat ", heartbeat,
          " s, grace 1 s)");
  // The 15 s is a hang guard: how soon a silent node counts as dead is
  // checked on an injected clock (rendezvous_round_test.cpp).
  CHECK_MESSAGE(stopped, survivor.output());
  REQUIRE_MESSAGE(survivor.wait(15), survivor.output());  // re-join times out: no hang
  CHECK(survivor.exit_code() != 0);
  // Orphans are reaped by init: a zombie is gone too.
  auto running = [](pid_t pid) {
    const std::string stat = dtrain::testing::read_file("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  };
  CHECK_MESSAGE(wait_until([&] { return std::none_of(victim_pids.begin(), victim_pids.end(), running); }, 5),
                victim.output());
}

TEST_CASE("2 agents, one agent SIGKILLed: the other stops its workers and does not hang") {
  SUBCASE("standalone rendezvous, agent 1 killed") { check_survivor_after_kill(false); }
  SUBCASE("node 0 (embedding the rendezvous) killed") { check_survivor_after_kill(true); }
}

TEST_CASE("SLURM: two agents with SLURM_NODEID/NNODES/JOB_NODELIST and no --node-rank/--rdzv") {
  Job job;
  // cluster.nodes 1 in the spec: SLURM_NNODES=2 must make it 2. The
  // rendezvous port comes from the spec, the host from the node list.
  const int port = free_port();
  std::string spec = job.spec("nodes: 1, procs_per_node: 2, grace_s: 1, rendezvous: {endpoint: "
                              "'127.0.0.1:" + std::to_string(port) +
                                  "', join_timeout_s: 30, heartbeat_s: 0.5}",
                              "dp: 4");
  auto slurm = [](int node) {
    return std::vector<std::string>{"DTRAIN_TOKEN=itest-slurm", "SLURM_NODEID=" + std::to_string(node),
                                    "SLURM_NNODES=2", "SLURM_JOB_NODELIST=localhost,localhost"};
  };
  // Node 1 first: it waits for node 0's rendezvous, and must still be node 1.
  // Node 0 starts once node 1 has logged its start-up summary (the line
  // before it joins): an event, not a sleep.
  Child& a1 = job.start({"launch", spec}, "agent1", slurm(1));
  REQUIRE_MESSAGE(wait_until([&] { return a1.output().find("doctor: ") != std::string::npos; }, 30), a1.output());
  Child& a0 = job.start({"launch", spec}, "agent0", slurm(0));
  REQUIRE_MESSAGE(a0.wait(60), a0.output());
  REQUIRE_MESSAGE(a1.wait(60), a1.output());
  REQUIRE_MESSAGE(a0.exit_code() == 0, a0.output());
  REQUIRE_MESSAGE(a1.exit_code() == 0, a1.output());
  CHECK_MESSAGE(a0.output().find("listening on port " + std::to_string(port)) != std::string::npos,
                a0.output());
  auto reports = job.reports();
  REQUIRE(reports.size() == 4);
  std::set<int> ranks;
  for (const auto& r : reports) {
    const int rank = as_int(r, "RANK");
    ranks.insert(rank);
    // Each worker inherited its agent's SLURM_NODEID: the node it ran on.
    CHECK(as_int(r, "GROUP_RANK") == as_int(r, "SLURM_NODEID"));
    CHECK(as_int(r, "GROUP_RANK") == rank / 2);
    CHECK(as_int(r, "WORLD_SIZE") == 4);
    CHECK(as_int(r, "LOCAL_WORLD_SIZE") == 2);
    CHECK(as_int(r, "LOCAL_RANK") == rank % 2);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
}

TEST_CASE("SLURM_* of the test runner do not reach dtrain: a 1-node launch stays 1 node") {
  // As if the tests ran inside an allocation of 3 nodes; restored on exit.
  struct SlurmEnvOfRunner {
    SlurmEnvOfRunner() {
      setenv("SLURM_NODEID", "1", 1);
      setenv("SLURM_NNODES", "3", 1);
      setenv("SLURM_JOB_NODELIST", "nosuchhost[1-3]", 1);
    }
    ~SlurmEnvOfRunner() {
      unsetenv("SLURM_NODEID");
      unsetenv("SLURM_NNODES");
      unsetenv("SLURM_JOB_NODELIST");
    }
  } runner_env;
  Job job;
  std::string spec = job.spec("nodes: 1, procs_per_node: 2, grace_s: 1, "
                              "rendezvous: {join_timeout_s: 5}",
                              "dp: 2");
  auto [code, out] = job.run({"launch", spec}, 30);
  REQUIRE_MESSAGE(code == 0, out);
  auto reports = job.reports();
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) {
    CHECK(as_int(r, "GROUP_RANK") == 0);
    CHECK(as_int(r, "WORLD_SIZE") == 2);
    CHECK(r["SLURM_NODEID"] == "");
    CHECK(r["SLURM_NNODES"] == "");
    CHECK(r["SLURM_JOB_NODELIST"] == "");
  }
}
