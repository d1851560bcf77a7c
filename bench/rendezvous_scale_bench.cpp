// Rendezvous scale: N agents (threads, each its own RendezvousClient) join one
// round of an in-process server on loopback; reports the time until every
// agent holds its ranks, and checks the ranks are a disjoint cover of the
// world. The threads share this process's CPUs (and gRPC's one connection to
// the server) with the server, so the figures include the clients' own work.
// Usage: rendezvous_scale_bench [--agents 256,1024] [--slots 1] [--reps 3]
//        [--preconnect]  each agent calls Status once before the clock starts,
//                        so its channel is up (an agent that started earlier)
//        [--state-only]  no server, no threads: RoundState alone, N joins each
//                        followed by poll() as the server does (the round
//                        logic's own cost, apart from gRPC and TLS)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

RunResult run_once(int agents, int slots, bool preconnect) {
  ServerOptions so;
  so.job = "bench";
  so.token = "t";
  so.min_nodes = so.max_nodes = agents;
  so.mesh.size(dtrain::mesh::Axis::dp) = agents * slots;
  RendezvousServer server(so);
  std::string endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));

  std::vector<Assignment> got(static_cast<size_t>(agents));
  std::vector<Clock::time_point> sent(static_cast<size_t>(agents)), done(sent);
  std::atomic<int> failures{0};
  // Agents (clients, channels, threads) exist before the clock starts; all
  // then join at once. The start gate is a futex (atomic wait), not a
  // condition variable: waking 4096 waiters of one mutex serialises them on
  // it, which spread the joins over up to a second on 2 cores.
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < agents; ++i)
    threads.emplace_back([&, i] {
      ClientOptions co;
      co.endpoint = endpoint;
      co.job = "bench";
      co.token = "t";  // TLS identity derived from it, as agents do
      co.call_timeout_s = 30.0;
      RendezvousClient client(co);
      JoinInfo info;
      info.node_id = "agent-" + std::to_string(i);
      info.host = "127.0.0.1";
      info.slots = slots;
      info.master_port = 29500;
      if (preconnect) {
        try {
          client.status();
        } catch (const dtrain::Error& e) {
          if (failures++ == 0) std::fprintf(stderr, "agent %d: status: %s\n", i, e.message().c_str());
        }
      }
      ready.fetch_add(1);
      go.wait(false);
      auto k = static_cast<size_t>(i);
      sent[k] = Clock::now();
      try {
        got[k] = client.join(info, 60);
      } catch (const dtrain::Error& e) {
        if (failures++ == 0) std::fprintf(stderr, "agent %d: %s\n", i, e.message().c_str());
      }
      done[k] = Clock::now();
    });
  while (ready.load() < agents) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  go.store(true);
  go.notify_all();
  for (auto& t : threads) t.join();
  std::printf("# placement per reply (agent 0): %zu ranks, %zu groups\n", got[0].placement.ranks.size(),
              got[0].placement.groups.size());

  RunResult r;
  r.ok = failures == 0;
  std::vector<int> owner(static_cast<size_t>(agents * slots), -1);
  for (int i = 0; i < agents && r.ok; ++i)
    for (const RankPlacement& p : got[static_cast<size_t>(i)].local_ranks) {
      if (owner[static_cast<size_t>(p.rank)] != -1) r.ok = false;
      owner[static_cast<size_t>(p.rank)] = i;
    }
  r.ok = r.ok && std::count(owner.begin(), owner.end(), -1) == 0;
  auto first = *std::min_element(sent.begin(), sent.end());
  auto last_sent = *std::max_element(sent.begin(), sent.end());
  auto last_done = *std::max_element(done.begin(), done.end());
  r.all_s = secs(first, last_done);
  r.close_s = secs(last_sent, last_done);
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
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--preconnect")) preconnect = true;
    else if (!std::strcmp(argv[i], "--state-only")) state_only = true;
    else if (i + 1 >= argc) break;
    else if (!std::strcmp(argv[i], "--agents")) sizes = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--slots")) slots = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[++i]);
  }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3)
    std::printf("# load average %.2f %.2f %.2f on %u cores%s\n", load[0], load[1], load[2],
                std::thread::hardware_concurrency(), preconnect ? "; --preconnect" : "");
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
      RunResult r = run_once(agents, slots, preconnect);
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
