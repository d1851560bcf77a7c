// The simulated agents of bench/rendezvous_scale_bench.cpp, in one process:
// either one thread and one RendezvousClient per agent (the old mode), or
// (--async) every agent a small state machine on one gRPC CompletionQueue
// served by 2 threads. Either way each agent has its own channel and its own
// TCP + TLS connection, so the server sees one connection per agent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::bench {

// One agent's record: when it sent its join (or, without --preconnect, began
// to connect), when it held its ranks (the steady clock is the machine's
// monotonic clock: comparable across processes).
struct AgentRecord {
  int64_t sent_ns = 0, done_ns = 0;
  std::vector<int> ranks;
};

struct AgentsRun {
  std::string endpoint;
  int first = 0;           // agents [first, first + count)
  int count = 0;
  int slots = 1;
  bool preconnect = false;  // channels up (TLS handshake done) before the clock
  int window = 32;          // TLS handshakes in flight at once in this process
  // Called once every agent exists (and is connected, with preconnect); the
  // clock starts when it returns.
  std::function<void()> gate = [] {};
  // Called once every agent has its answer, before any connection closes.
  std::function<void(const std::vector<AgentRecord>&)> done = [](const std::vector<AgentRecord>&) {};
};

int64_t steady_ns();

// Both return the number of failed agents (the first failure printed).
int run_agents_threads(const AgentsRun& run, std::vector<AgentRecord>& out);
int run_agents_async(const AgentsRun& run, std::vector<AgentRecord>& out);

}  // namespace dtrain::bench
