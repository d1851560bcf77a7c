// Rendezvous scale: N simulated agents, each its own channel and TLS
// connection, join one round of a server on loopback; reports the time until
// every agent holds its ranks, the server's own CPU time (--procs), and
// checks the ranks are a disjoint cover of the world.
// Usage: rendezvous_scale_bench [--agents 256,1024] [--slots 1] [--reps 3]
//        [--async]       the agents are state machines on one gRPC completion
//                        queue and 2 threads per process, not one thread each
//                        (rendezvous_scale_agents.h): cheap clients, so the
//                        time is the server's, not 16384 client threads'
//        [--preconnect]  every agent's channel is up (TLS handshake done)
//                        before the clock starts (an agent that started earlier)
//        [--window W]    handshakes in flight per process (32): with
//                        --preconnect, and in --async also without it
//        [--procs P]     the agents run in P child processes (fresh, exec'd),
//                        the server alone in this one: one process holds one
//                        descriptor per agent, not two (16384 agents fit), and
//                        its CPU time is the server's
//        [--state-only]  no server, no threads: RoundState alone, N joins each
//                        followed by poll() as the server does (the round
//                        logic's own cost, apart from gRPC and TLS)
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/rendezvous_scale_agents.h"
#include "common/log.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using dtrain::bench::AgentRecord;
using dtrain::bench::AgentsRun;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int agents = 0, slots = 1, procs = 1, window = 32;
  bool preconnect = false, async = false;
};

struct RunResult {
  double all_s = 0;       // first join sent -> last agent has its ranks
  double close_s = 0;     // last join sent -> last agent has its ranks
  // --procs: CPU seconds (user + system) of this process, i.e. the server:
  // while the agents connected (before the clock), and from the clock's start
  // until every agent had its answer; and the child processes' CPU seconds.
  double server_connect_cpu_s = -1, server_round_cpu_s = -1, clients_cpu_s = -1;
  int server_fds = -1;    // descriptors the server's process held at the start
  bool ok = true;
};

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double cpu_s(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double self_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return cpu_s(u);
}

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n - 3;  // ".", ".." and the directory's own descriptor
}

// --procs: a child's agents (argv as spawn_child gives it). Writes "r" when they are ready, waits for a byte
// on stdin (the start), then one line per agent ("index sent_ns done_ns
// rank...") and "e"; its connections stay up until the next byte (or EOF),
// so the server's CPU time up to "e" holds no teardown.
int child_main(char** argv) {
  dtrain::log::set_level(dtrain::log::Level::warn);
  AgentsRun run;
  run.endpoint = argv[2];
  run.first = std::stoi(argv[3]);
  run.count = std::stoi(argv[4]);
  run.slots = std::stoi(argv[5]);
  run.preconnect = argv[6][0] == '1';
  const bool async = argv[7][0] == '1';
  run.window = std::stoi(argv[8]);
  run.gate = [] {
    std::fputs("r\n", stdout);
    std::fflush(stdout);
    char c;
    if (::read(0, &c, 1) != 1) std::exit(3);
  };
  run.done = [&run](const std::vector<AgentRecord>& records) {
    for (int k = 0; k < run.count; ++k) {
      const AgentRecord& r = records[static_cast<size_t>(k)];
      std::printf("%d %lld %lld", run.first + k, static_cast<long long>(r.sent_ns), static_cast<long long>(r.done_ns));
      for (int rank : r.ranks) std::printf(" %d", rank);
      std::printf("\n");
    }
    std::fputs("e\n", stdout);
    std::fflush(stdout);
    char c;
    (void)!::read(0, &c, 1);
  };
  std::vector<AgentRecord> records;
  const int failed = async ? run_agents_async(run, records) : run_agents_threads(run, records);
  if (failed) std::fprintf(stderr, "agents %d-%d: %d failed\n", run.first, run.first + run.count - 1, failed);
  return failed == 0 ? 0 : 1;
}

struct Child {
  pid_t pid = -1;
  FILE* from = nullptr;  // its stdout
  int to = -1;           // its stdin
};

// fork + exec of this program (a fresh process: no gRPC state inherited from
// the server's threads) as `--child ENDPOINT FIRST COUNT SLOTS PRECONNECT ASYNC WINDOW`.
Child spawn_child(const std::string& endpoint, int first, int count, const Config& c) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
  std::vector<std::string> args = {"/proc/self/exe", "--child", endpoint, std::to_string(first),
                                   std::to_string(count), std::to_string(c.slots), c.preconnect ? "1" : "0",
                                   c.async ? "1" : "0", std::to_string(c.window)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {  // only async-signal-safe calls until exec
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  child.to = in[1];
  child.from = ::fdopen(out[0], "r");
  return child;
}

// The agents spread over `c.procs` children; returns the failures (a child
// that failed, or an agent it could not report). Fills r's CPU figures.
int run_agents_in_children(const std::string& endpoint, const Config& c, std::vector<AgentRecord>& out,
                           RunResult& r) {
  out.assign(static_cast<size_t>(c.agents), {});
  const double cpu0 = self_cpu_s();
  std::vector<Child> children;
  for (int p = 0; p < c.procs; ++p) {
    const int first = c.agents * p / c.procs, next = c.agents * (p + 1) / c.procs;
    children.push_back(spawn_child(endpoint, first, next - first, c));
  }
  char line[1 << 16];
  for (Child& ch : children)
    if (!std::fgets(line, sizeof line, ch.from) || line[0] != 'r') std::fprintf(stderr, "a child did not start\n");
  const double cpu1 = self_cpu_s();
  r.server_fds = open_fds();
  const int64_t clock0 = dtrain::bench::steady_ns();
  for (Child& ch : children)  // the start: one byte each
    if (::write(ch.to, "g", 1) != 1) std::fprintf(stderr, "a child is gone\n");
  int failures = 0, reported = 0;
  for (Child& ch : children)
    while (std::fgets(line, sizeof line, ch.from) && line[0] != 'e') {
      std::istringstream in(line);
      long long i, sent, done;
      if (!(in >> i >> sent >> done) || i < 0 || i >= c.agents) continue;
      AgentRecord& a = out[static_cast<size_t>(i)];
      a.sent_ns = sent;
      a.done_ns = done;
      for (int rank; in >> rank;) a.ranks.push_back(rank);
      ++reported;
    }
  r.server_connect_cpu_s = cpu1 - cpu0;
  // For a profile of the round alone: `perf record -k CLOCK_MONOTONIC`, then
  // `perf report --time START,END` with these seconds.
  if (std::getenv("RDZV_BENCH_WINDOW"))
    std::printf("# round window (CLOCK_MONOTONIC s): %.6f,%.6f\n", static_cast<double>(clock0) * 1e-9,
                static_cast<double>(dtrain::bench::steady_ns()) * 1e-9);
  r.server_round_cpu_s = self_cpu_s() - cpu1;
  r.clients_cpu_s = 0;
  for (Child& ch : children) {
    ::close(ch.to);  // EOF: the child closes its connections and exits
    std::fclose(ch.from);
    int status = 0;
    rusage u{};
    ::wait4(ch.pid, &status, 0, &u);
    r.clients_cpu_s += cpu_s(u);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      std::fprintf(stderr, "child %d: %s %d\n", static_cast<int>(ch.pid),
                   WIFEXITED(status) ? "exit code" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
  }
  if (reported < c.agents) std::fprintf(stderr, "%d of %d agents reported\n", reported, c.agents);
  return failures + (c.agents - reported);
}

RunResult run_once(const Config& c) {
  ServerOptions so;
  so.job = "bench";
  so.token = "t";
  so.min_nodes = so.max_nodes = c.agents;
  so.mesh.size(dtrain::mesh::Axis::dp) = c.agents * c.slots;
  so.heartbeat_s = 3600;  // these agents never beat: no deaths while the children report
  RendezvousServer server(so);
  std::string endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));

  RunResult r;
  std::vector<AgentRecord> got;
  int failures = 0;
  if (c.procs > 1) {
    failures = run_agents_in_children(endpoint, c, got, r);
  } else {
    AgentsRun run;
    run.endpoint = endpoint;
    run.count = c.agents;
    run.slots = c.slots;
    run.preconnect = c.preconnect;
    run.window = c.window;
    failures = c.async ? dtrain::bench::run_agents_async(run, got) : dtrain::bench::run_agents_threads(run, got);
  }
  r.ok = failures == 0;
  std::vector<int> owner(static_cast<size_t>(c.agents * c.slots), -1);
  for (int i = 0; i < c.agents && r.ok; ++i)
    for (int rank : got[static_cast<size_t>(i)].ranks) {
      if (rank < 0 || rank >= c.agents * c.slots || owner[static_cast<size_t>(rank)] != -1) r.ok = false;
      else owner[static_cast<size_t>(rank)] = i;
    }
  r.ok = r.ok && std::count(owner.begin(), owner.end(), -1) == 0;
  int64_t first = INT64_MAX, last_sent = 0, last_done = 0;
  for (const AgentRecord& a : got) {
    first = std::min(first, a.sent_ns);
    last_sent = std::max(last_sent, a.sent_ns);
    last_done = std::max(last_done, a.done_ns);
  }
  r.all_s = static_cast<double>(last_done - first) * 1e-9;
  r.close_s = static_cast<double>(last_done - last_sent) * 1e-9;
  return r;
}

// RoundState alone: seconds for the first n-1 joins (each polled) and for the
// last join with the round's close.
void run_state_only(int agents, int slots) {
  ServerOptions so;
  so.job = "bench";
  so.token = "t";
  so.min_nodes = so.max_nodes = agents;
  so.mesh.size(dtrain::mesh::Axis::dp) = agents * slots;
  RoundState state(so);
  const TimePoint t0{};
  const auto start = Clock::now();
  auto before_last = start;
  size_t answered = 0;
  for (int i = 0; i < agents; ++i) {
    if (i == agents - 1) before_last = Clock::now();
    JoinInfo info;
    info.node_id = "agent-" + std::to_string(i);
    info.host = "127.0.0.1";
    info.slots = slots;
    if (state.join(info, static_cast<uint64_t>(i + 1), t0, t0 + std::chrono::seconds(60))) std::abort();
    answered += state.poll(t0).size();
  }
  const auto end = Clock::now();
  std::printf("%8d %6d %7d %12.3f %12.3f %12.3f %6s\n", agents, slots, agents * slots, secs(start, end),
              secs(start, before_last), secs(before_last, end), answered == size_t(agents) ? "ok" : "FAIL");
  std::fflush(stdout);
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

void print_run(const Config& c, int rep, const RunResult& r) {
  std::printf("%8d %6d %7d %5d %12.3f %12.3f", c.agents, c.slots, c.agents * c.slots, rep, r.all_s, r.close_s);
  if (r.server_round_cpu_s >= 0)
    std::printf(" %12.3f %12.3f %12.3f %8d", r.server_round_cpu_s, r.server_connect_cpu_s, r.clients_cpu_s,
                r.server_fds);
  else
    std::printf(" %12s %12s %12s %8s", "-", "-", "-", "-");
  std::printf(" %6s\n", r.ok ? "ok" : "FAIL");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024};
  Config c;
  int reps = 3;
  bool state_only = false;
  if (argc == 9 && !std::strcmp(argv[1], "--child")) return child_main(argv);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--preconnect")) c.preconnect = true;
    else if (!std::strcmp(argv[i], "--async")) c.async = true;
    else if (!std::strcmp(argv[i], "--state-only")) state_only = true;
    else if (i + 1 >= argc) break;
    else if (!std::strcmp(argv[i], "--agents")) sizes = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--slots")) c.slots = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--procs")) c.procs = std::max(1, std::stoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--window")) c.window = std::max(1, std::stoi(argv[++i]));
  }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3)
    std::printf("# load average %.2f %.2f %.2f on %u cores; %s agents%s, window %d; in %s\n", load[0], load[1],
                load[2], std::thread::hardware_concurrency(), c.async ? "async" : "thread-per-agent",
                c.preconnect ? ", --preconnect" : " (handshakes counted)", c.window,
                c.procs > 1 ? (std::to_string(c.procs) + " child processes").c_str() : "this process");
  dtrain::log::set_level(dtrain::log::Level::warn);  // keep the round summaries out of the table
  if (state_only) {
    std::printf("# RoundState alone (--state-only)\n%8s %6s %7s %12s %12s %12s %6s\n", "agents", "slots", "world",
                "all_s", "joins_s", "close_s", "check");
    for (int agents : sizes)
      for (int rep = 0; rep < reps; ++rep) run_state_only(agents, c.slots);
    return 0;
  }
  std::printf("# all_s: first join sent (or first handshake begun) -> every agent has its ranks; srv_cpu_s: the\n"
              "# server process's CPU seconds over that time; conn_cpu_s: its CPU seconds before the clock\n"
              "# (--preconnect handshakes); cli_cpu_s: the agent processes' CPU seconds; fds: the server's\n");
  std::printf("%8s %6s %7s %5s %12s %12s %12s %12s %12s %8s %6s\n", "agents", "slots", "world", "rep", "all_s",
              "close_s", "srv_cpu_s", "conn_cpu_s", "cli_cpu_s", "fds", "check");
  bool all_ok = true;
  for (int agents : sizes) {
    c.agents = agents;
    std::vector<double> totals;
    for (int rep = 0; rep < reps; ++rep) {
      RunResult r = run_once(c);
      all_ok = all_ok && r.ok;
      totals.push_back(r.all_s);
      print_run(c, rep, r);
    }
    std::sort(totals.begin(), totals.end());
    std::printf("%8d agents: median %.3f s until every agent has its ranks (goal <= 3 s at 16384)\n", agents,
                totals[totals.size() / 2]);
  }
  return all_ok ? 0 : 1;
}
