// Rendezvous scale: N agents (threads, each its own RendezvousClient) join one
// round of an in-process server on loopback; reports the time until every
// agent holds its ranks, and checks the ranks are a disjoint cover of the
// world. Usage: rendezvous_scale_bench [--agents 256,1024] [--slots 1] [--reps 3]
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"

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

RunResult run_once(int agents, int slots) {
  ServerOptions so;
  so.job = "bench";
  so.token = "t";
  so.min_nodes = so.max_nodes = agents;
  so.mesh.dp = agents * slots;
  RendezvousServer server(so);
  std::string endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));

  std::vector<Assignment> got(static_cast<size_t>(agents));
  std::vector<Clock::time_point> sent(static_cast<size_t>(agents)), done(sent);
  std::atomic<int> failures{0};
  // Agents (clients, channels, threads) exist before the clock starts; all
  // then join at once.
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  int ready = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < agents; ++i)
    threads.emplace_back([&, i] {
      RendezvousClient client({endpoint, "bench", "t", 30.0});
      JoinInfo info;
      info.node_id = "agent-" + std::to_string(i);
      info.host = "127.0.0.1";
      info.slots = slots;
      info.master_port = 29500;
      {
        std::unique_lock<std::mutex> lock(mu);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      auto k = static_cast<size_t>(i);
      sent[k] = Clock::now();
      try {
        got[k] = client.join(info, 60);
      } catch (const dtrain::Error& e) {
        if (failures++ == 0) std::fprintf(stderr, "agent %d: %s\n", i, e.message().c_str());
      }
      done[k] = Clock::now();
    });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return ready == agents; });
    go = true;
  }
  cv.notify_all();
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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--agents")) sizes = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--slots")) slots = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
  }
  dtrain::log::set_level(dtrain::log::Level::warn);  // keep the round summaries out of the table
  std::printf("%8s %6s %7s %5s %14s %14s %6s\n", "agents", "slots", "world", "rep",
              "all_joined_s", "close_to_all_s", "check");
  bool all_ok = true;
  for (int agents : sizes) {
    std::vector<double> totals;
    for (int rep = 0; rep < reps; ++rep) {
      RunResult r = run_once(agents, slots);
      all_ok = all_ok && r.ok;
      totals.push_back(r.all_s);
      std::printf("%8d %6d %7d %5d %14.3f %14.3f %6s\n", agents, slots, agents * slots, rep,
                  r.all_s, r.close_s, r.ok ? "ok" : "FAIL");
      std::fflush(stdout);
    }
    std::sort(totals.begin(), totals.end());
    std::printf("%8d agents: median %.3f s until every agent has its ranks (goal < 2 s at 1024)\n",
                agents, totals[totals.size() / 2]);
  }
  return all_ok ? 0 : 1;
}
