// Rendezvous scale: N agents (threads, each its own RendezvousClient, channel
// and TLS connection) join one round of a server on loopback; reports the time
// until every agent holds its ranks, and checks the ranks are a disjoint cover
// of the world. The agents share the machine's CPUs with the server, so the
// figures include the clients' own work (TLS handshakes included).
// Usage: rendezvous_scale_bench [--agents 256,1024] [--slots 1] [--reps 3]
//        [--preconnect]  each agent calls Status once before the clock starts,
//                        so its channel is up (an agent that started earlier)
//        [--procs P]     the agents run in P child processes (fresh, exec'd),
//                        the server alone in this one: one process holds one
//                        descriptor per agent, not two (16384 agents fit)
//        [--state-only]  no server, no threads: RoundState alone, N joins each
//                        followed by poll() as the server does (the round
//                        logic's own cost, apart from gRPC and TLS)
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <semaphore>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

struct RunResult {
  double all_s = 0;       // first join sent -> last agent has its ranks
  double close_s = 0;     // last join sent -> last agent has its ranks
  bool ok = true;
};

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// One agent's record: when it sent its join, when it held its ranks (the
// steady clock is the machine's monotonic clock: comparable across processes).
struct AgentRecord {
  int64_t sent_ns = 0, done_ns = 0;
  std::vector<int> ranks;
};

// Agents [first, first + count) as threads of this process, each with its own
// client. Once all exist (and are connected, with preconnect) gate() is
// called; it returns when the clock starts, and all then join at once.
// Returns the number of failed agents (the first failure printed).
int run_agents(const std::string& endpoint, int first, int count, int slots, bool preconnect,
               const std::function<void()>& gate, std::vector<AgentRecord>& out) {
  out.assign(static_cast<size_t>(count), {});
  std::atomic<int> failures{0};
  // The start gate is a futex (atomic wait), not a condition variable:
  // waking 4096 waiters of one mutex serialises them on it, which spread the
  // joins over up to a second on 2 cores.
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  // Preconnect: at most 32 handshakes in flight per process. 16384 at once
  // overran the server: handshakes timed out before the SETTINGS frame, the
  // clients retried, and the half-open retries exhausted its descriptors.
  std::counting_semaphore<32> connecting(32);
  std::vector<std::thread> threads;
  for (int k = 0; k < count; ++k)
    threads.emplace_back([&, k] {
      const int i = first + k;
      ClientOptions co;
      co.endpoint = endpoint;
      co.job = "bench";
      co.token = "t";  // TLS identity derived from it, as agents do
      co.call_timeout_s = 300.0;  // the preconnect of 16384 agents: their handshakes queue
      RendezvousClient client(co);
      JoinInfo info;
      info.node_id = "agent-" + std::to_string(i);
      info.host = "127.0.0.1";
      info.slots = slots;
      info.master_port = 29500;
      if (preconnect) {
        connecting.acquire();
        try {
          client.status();
        } catch (const dtrain::Error& e) {
          if (failures++ == 0) std::fprintf(stderr, "agent %d: status: %s\n", i, e.message().c_str());
        }
        connecting.release();
      }
      ready.fetch_add(1);
      go.wait(false);
      AgentRecord& r = out[static_cast<size_t>(k)];
      r.sent_ns = ns(Clock::now());
      try {
        Assignment a = client.join(info, 300);
        for (const RankPlacement& p : a.local_ranks) r.ranks.push_back(p.rank);
        if (r.ranks.empty() && failures++ == 0)
          std::fprintf(stderr, "agent %d: no ranks (round %llu, node %d of %d, world %d)\n", i,
                       static_cast<unsigned long long>(a.round), a.node_rank, a.num_nodes, a.world);
      } catch (const dtrain::Error& e) {
        if (failures++ == 0) std::fprintf(stderr, "agent %d: %s\n", i, e.message().c_str());
      }
      r.done_ns = ns(Clock::now());
    });
  while (ready.load() < count) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  gate();
  go.store(true);
  go.notify_all();
  for (auto& t : threads) t.join();
  return failures.load();
}

// --procs: a child's agents. Writes "r" when they are ready, waits for a byte
// on stdin (the start), then one line per agent: "index sent_ns done_ns rank...".
int child_main(const std::string& endpoint, int first, int count, int slots, bool preconnect) {
  std::vector<AgentRecord> records;
  int failed = run_agents(endpoint, first, count, slots, preconnect, [] {
    std::fputs("r\n", stdout);
    std::fflush(stdout);
    char c;
    if (::read(0, &c, 1) != 1) std::exit(3);
  }, records);
  for (int k = 0; k < count; ++k) {
    const AgentRecord& r = records[static_cast<size_t>(k)];
    std::printf("%d %lld %lld", first + k, static_cast<long long>(r.sent_ns), static_cast<long long>(r.done_ns));
    for (int rank : r.ranks) std::printf(" %d", rank);
    std::printf("\n");
  }
  std::fflush(stdout);
  if (failed) std::fprintf(stderr, "agents %d-%d: %d failed\n", first, first + count - 1, failed);
  return failed == 0 ? 0 : 1;
}

struct Child {
  pid_t pid = -1;
  FILE* from = nullptr;  // its stdout
  int to = -1;           // its stdin
};

// fork + exec of this program (a fresh process: no gRPC state inherited from
// the server's threads) as `--child ENDPOINT FIRST COUNT SLOTS PRECONNECT`.
Child spawn_child(const std::string& endpoint, int first, int count, int slots, bool preconnect) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
  std::vector<std::string> args = {"/proc/self/exe", "--child", endpoint, std::to_string(first),
                                   std::to_string(count), std::to_string(slots), preconnect ? "1" : "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {  // only async-signal-safe calls until exec
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  c.to = in[1];
  c.from = ::fdopen(out[0], "r");
  return c;
}

// The agents spread over `procs` children; returns the failures (a child that
// failed, or an agent it could not report).
int run_agents_in_children(const std::string& endpoint, int agents, int slots, bool preconnect, int procs,
                           std::vector<AgentRecord>& out) {
  out.assign(static_cast<size_t>(agents), {});
  std::vector<Child> children;
  for (int p = 0; p < procs; ++p) {
    const int first = agents * p / procs, next = agents * (p + 1) / procs;
    children.push_back(spawn_child(endpoint, first, next - first, slots, preconnect));
  }
  char line[1 << 16];
  for (Child& c : children)
    if (!std::fgets(line, sizeof line, c.from) || line[0] != 'r') std::fprintf(stderr, "a child did not start\n");
  for (Child& c : children)  // the start: one byte each
    if (::write(c.to, "g", 1) != 1) std::fprintf(stderr, "a child is gone\n");
  int failures = 0, reported = 0;
  for (Child& c : children) {
    while (std::fgets(line, sizeof line, c.from)) {
      std::istringstream in(line);
      long long i, sent, done;
      if (!(in >> i >> sent >> done) || i < 0 || i >= agents) continue;
      AgentRecord& r = out[static_cast<size_t>(i)];
      r.sent_ns = sent;
      r.done_ns = done;
      for (int rank; in >> rank;) r.ranks.push_back(rank);
      ++reported;
    }
    std::fclose(c.from);
    ::close(c.to);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      std::fprintf(stderr, "child %d: %s %d\n", static_cast<int>(c.pid),
                   WIFEXITED(status) ? "exit code" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
  }
  if (reported < agents) std::fprintf(stderr, "%d of %d agents reported\n", reported, agents);
  return failures + (agents - reported);
}

RunResult run_once(int agents, int slots, bool preconnect, int procs) {
  ServerOptions so;
  so.job = "bench";
  so.token = "t";
  so.min_nodes = so.max_nodes = agents;
  so.mesh.size(dtrain::mesh::Axis::dp) = agents * slots;
  so.heartbeat_s = 3600;  // these agents never beat: no deaths while the children report
  RendezvousServer server(so);
  std::string endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));

  std::vector<AgentRecord> got;
  const int failures = procs > 1 ? run_agents_in_children(endpoint, agents, slots, preconnect, procs, got)
                                 : run_agents(endpoint, 0, agents, slots, preconnect, [] {}, got);
  std::printf("# ranks per reply (agent 0): %zu\n", got[0].ranks.size());

  RunResult r;
  r.ok = failures == 0;
  std::vector<int> owner(static_cast<size_t>(agents * slots), -1);
  for (int i = 0; i < agents && r.ok; ++i)
    for (int rank : got[static_cast<size_t>(i)].ranks) {
      if (rank < 0 || rank >= agents * slots || owner[static_cast<size_t>(rank)] != -1) r.ok = false;
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024};
  int slots = 1, reps = 3;
  bool preconnect = false, state_only = false;
  int procs = 1;
  if (argc == 7 && !std::strcmp(argv[1], "--child")) {
    dtrain::log::set_level(dtrain::log::Level::warn);
    return child_main(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), argv[6][0] == '1');
  }
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--preconnect")) preconnect = true;
    else if (!std::strcmp(argv[i], "--state-only")) state_only = true;
    else if (i + 1 >= argc) break;
    else if (!std::strcmp(argv[i], "--agents")) sizes = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--slots")) slots = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--procs")) procs = std::max(1, std::stoi(argv[++i]));
  }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3)
    std::printf("# load average %.2f %.2f %.2f on %u cores%s; agents in %s\n", load[0], load[1], load[2],
                std::thread::hardware_concurrency(), preconnect ? "; --preconnect" : "",
                procs > 1 ? (std::to_string(procs) + " child processes").c_str() : "this process");
  dtrain::log::set_level(dtrain::log::Level::warn);  // keep the round summaries out of the table
  if (state_only) {
    std::printf("# RoundState alone (--state-only)\n%8s %6s %7s %12s %12s %12s %6s\n", "agents", "slots", "world",
                "all_s", "joins_s", "close_s", "check");
    for (int agents : sizes)
      for (int rep = 0; rep < reps; ++rep) run_state_only(agents, slots);
    return 0;
  }
  std::printf("%8s %6s %7s %5s %14s %14s %6s\n", "agents", "slots", "world", "rep",
              "all_joined_s", "close_to_all_s", "check");
  bool all_ok = true;
  for (int agents : sizes) {
    std::vector<double> totals;
    for (int rep = 0; rep < reps; ++rep) {
      RunResult r = run_once(agents, slots, preconnect, procs);
      all_ok = all_ok && r.ok;
      totals.push_back(r.all_s);
      std::printf("%8d %6d %7d %5d %14.3f %14.3f %6s\n", agents, slots, agents * slots, rep,
                  r.all_s, r.close_s, r.ok ? "ok" : "FAIL");
      std::fflush(stdout);
    }
    std::sort(totals.begin(), totals.end());
    std::printf("%8d agents: median %.3f s until every agent has its ranks (goal < 2 s at 4096)\n",
                agents, totals[totals.size() / 2]);
  }
  return all_ok ? 0 : 1;
}
