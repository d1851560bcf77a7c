// launcher/heartbeat.h against a real rendezvous server on loopback: what
// the heartbeat thread does once the round moved on. Not here: the
// server's death rule itself (tests/unit/rendezvous).
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "launcher/heartbeat.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"

using namespace dtrain::rendezvous;
using dtrain::launcher::Heartbeat;

namespace {

JoinInfo node(int i) {
  JoinInfo j;
  j.node_id = "node-" + std::to_string(i);
  j.host = "10.0.0." + std::to_string(i);
  j.slots = 1;
  j.master_port = 30000 + i;
  return j;
}

}  // namespace

// An agent learns of a round change from its heartbeat, then stops its
// workers (SIGTERM, SIGKILL after grace_s) before re-joining: that can take
// longer than 3 heartbeats, and the node must not be declared dead for it.
TEST_CASE("heartbeat: after the round moved on it keeps beating until the agent stops it") {
  ServerOptions o;
  o.job = "job-a";
  o.token = "t";
  o.min_nodes = 1;
  o.max_nodes = 2;
  o.mesh = dtrain::mesh::make_mesh(1, 1, 1, 1);
  o.last_call_s = 30;  // a re-formed round closes when its survivors are back (a hang guard only)
  o.heartbeat_s = 0.3;
  RendezvousServer server(o);
  ClientOptions c;
  c.endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));
  c.job = o.job;
  c.token = o.token;
  c.call_timeout_s = 5;
  RendezvousClient agent0(c), agent1(c), watcher(c);
  auto joined1 = std::async(std::launch::async, [&] { return agent1.join(node(1), 30); });
  const Assignment first = agent0.join(node(0), 30);
  REQUIRE(joined1.get().round == first.round);
  Heartbeat beats0(agent0, "node-0", first.round, o.heartbeat_s, [] {});
  {
    // node-1's worker fails: its agent reports it, stops its heartbeat and
    // re-joins at once; the round re-forms and waits for node-0.
    Heartbeat beats1(agent1, "node-1", first.round, o.heartbeat_s, [] {});
    FailureReport f;
    f.node_id = "node-1";
    f.round = first.round;
    f.rank = 1;
    f.exit_code = 1;
    agent1.report_failure(f);
  }
  auto second = std::async(std::launch::async, [&] { return agent1.join(node(1), 30); });
  for (int i = 0; i < 3000 && beats0.verdict() == Heartbeat::Verdict::ok; ++i)  // 30-s hang guard
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(beats0.verdict() == Heartbeat::Verdict::round_changed);
  // node-0's agent now stops its workers for 6 heartbeat intervals (the
  // time passing is the case under test, not a synchronisation).
  std::this_thread::sleep_for(std::chrono::duration<double>(6 * o.heartbeat_s));
  // Declared dead, node-0 would leave the round's survivors and the round
  // close with node-1 alone.
  const ServerStatus st = watcher.status();
  MESSAGE("after 6 heartbeat intervals: round " << st.round << std::string(st.round_open ? " open" : " closed")
                                                << " with " << st.nodes.size() << " node(s)");
  CHECK(st.round == first.round + 1);
  CHECK(st.round_open);  // still waiting for node-0
  if (!st.round_open) return;
  // node-0 re-joins: both nodes form the next round.
  const Assignment again = agent0.join(node(0), 30);
  CHECK(again.num_nodes == 2);
  CHECK(second.get().num_nodes == 2);
}
