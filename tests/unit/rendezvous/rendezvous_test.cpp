// The gRPC rendezvous end to end on loopback: a real server on 127.0.0.1:0 in
// this process, agents as client threads. Checks ranks against place_ranks,
// every refusal, timeouts, elastic last call, heartbeat death, failures.
// Not covered here: the node agent (tests/unit/launcher, tests/integration).
#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "common/error.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/token.h"

using namespace dtrain::rendezvous;
using dtrain::Error;
using dtrain::ErrorCode;
using Seconds = std::chrono::duration<double>;

namespace {

const char* kToken = "s3cret-token";

ServerOptions server_options(int min_nodes, int max_nodes, dtrain::mesh::Mesh mesh) {
  ServerOptions o;
  o.job = "job-a";
  o.token = kToken;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.mesh = mesh;
  o.last_call_s = 0.3;
  o.heartbeat_s = 0.2;
  return o;
}

struct TestServer {
  RendezvousServer server;
  std::string endpoint;
  explicit TestServer(ServerOptions o) : server(std::move(o)) {
    endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));
  }
  RendezvousClient client(const std::string& token = kToken,
                          const std::string& job = "job-a") const {
    ClientOptions c;
    c.endpoint = endpoint;
    c.job = job;
    c.token = token;
    c.call_timeout_s = 5;
    return RendezvousClient(c);
  }
};

JoinInfo agent(int i, int slots, int node_rank = -1) {
  JoinInfo j;
  j.node_id = "node-" + std::to_string(i);
  j.host = "10.0.0." + std::to_string(i);
  j.slots = slots;
  j.node_rank = node_rank;
  j.master_port = 30000 + i;
  return j;
}

std::future<Assignment> join_async(const TestServer& s, JoinInfo info, double timeout_s = 5) {
  return std::async(std::launch::async, [&s, info, timeout_s] {
    return s.client().join(info, timeout_s);
  });
}

// Poll Status until `n` agents wait in the open round (joins are async);
// the 30 s (6000 polls) are a hang guard only.
void wait_for_waiting(const TestServer& s, size_t n) {
  auto c = s.client();
  for (int i = 0; i < 6000; ++i) {
    ServerStatus st = c.status();
    if (st.round_open && st.nodes.size() == n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL("agents never reached the open round: wanted " << n);
}

Error join_error(const TestServer& s, const JoinInfo& info, const std::string& token = kToken,
                 const std::string& job = "job-a", double timeout_s = 2) {
  try {
    s.client(token, job).join(info, timeout_s);
  } catch (const Error& e) {
    return e;
  }
  FAIL("join was not refused");
  return Error(ErrorCode::internal, "unreachable");
}

bool same(const RankPlacement& a, const RankPlacement& b) {
  return a.rank == b.rank && a.node == b.node && a.device == b.device && a.coord == b.coord;
}

// n agents with `slots` each; agent i requests node_rank requested[i] (or -1).
void check_round(int n, int slots, dtrain::mesh::Mesh mesh, std::vector<int> requested) {
  TestServer s(server_options(n, n, mesh));
  std::vector<std::future<Assignment>> futures;
  for (int i = 0; i < n; ++i)
    futures.push_back(join_async(s, agent(i, slots, requested.empty() ? -1 : requested[i])));
  std::vector<Assignment> got;
  for (auto& f : futures) got.push_back(f.get());
  Placement want = place_ranks(make_cluster(n, slots, 0, false), mesh, TrafficModel{});
  std::set<int> seen;
  std::set<int> node_ranks;
  for (int i = 0; i < n; ++i) {
    const Assignment& a = got[static_cast<size_t>(i)];
    CAPTURE(i);
    CHECK(a.round == 1);
    CHECK(a.num_nodes == n);
    CHECK(a.world == mesh.world());
    if (!requested.empty()) CHECK(a.node_rank == requested[static_cast<size_t>(i)]);
    node_ranks.insert(a.node_rank);
    // The reply holds this node's part: its ranks and exactly the groups they are in.
    std::vector<RankPlacement> mine;
    for (const RankPlacement& r : want.ranks)
      if (r.node == a.node_rank) mine.push_back(r);
    REQUIRE(a.placement.ranks.size() == mine.size());
    for (size_t r = 0; r < mine.size(); ++r) CHECK(same(a.placement.ranks[r], mine[r]));
    size_t groups_of_node = 0;
    for (const Group& g : want.groups) {
      bool in = std::any_of(g.ranks.begin(), g.ranks.end(), [&](int r) {
        return want.ranks[static_cast<size_t>(r)].node == a.node_rank;
      });
      if (!in) continue;
      ++groups_of_node;
      bool sent = std::any_of(a.placement.groups.begin(), a.placement.groups.end(),
                              [&](const Group& h) { return h.axis == g.axis && h.ranks == g.ranks; });
      CHECK_MESSAGE(sent, "group " << g.axis << " of node " << a.node_rank << " missing");
    }
    CHECK(a.placement.groups.size() == groups_of_node);
    CHECK(static_cast<int>(a.local_ranks.size()) == slots);
    for (const RankPlacement& r : a.local_ranks) {
      CHECK(r.node == a.node_rank);
      CHECK(seen.insert(r.rank).second);  // disjoint across agents
    }
    // MASTER_ADDR/PORT: the agent hosting rank 0 sent them.
    int host0 = want.ranks[0].node;
    for (int j = 0; j < n; ++j)
      if (got[static_cast<size_t>(j)].node_rank == host0) {
        CHECK(a.master_addr == agent(j, 1).host);
        CHECK(a.master_port == 30000 + j);
      }
  }
  CHECK(static_cast<int>(seen.size()) == mesh.world());
  CHECK(static_cast<int>(node_ranks.size()) == n);
  // The whole placement goes to whoever asks, equal to place_ranks.
  ServerStatus st = s.client().status(/*with_placement=*/true);
  REQUIRE(st.has_placement);
  REQUIRE(st.placement.ranks.size() == want.ranks.size());
  for (size_t r = 0; r < want.ranks.size(); ++r) CHECK(same(st.placement.ranks[r], want.ranks[r]));
  REQUIRE(st.placement.groups.size() == want.groups.size());
  for (size_t g = 0; g < want.groups.size(); ++g) {
    CHECK(st.placement.groups[g].axis == want.groups[g].axis);
    CHECK(st.placement.groups[g].ranks == want.groups[g].ranks);
    CHECK(st.placement.groups[g].bytes_per_step == want.groups[g].bytes_per_step);
  }
  CHECK(st.placement.mesh.world() == mesh.world());
  CHECK_FALSE(s.client().status().has_placement);  // only on request
}

}  // namespace

TEST_CASE("rendezvous: 1, 2 and 4 agents get disjoint ranks equal to place_ranks") {
  check_round(1, 4, dtrain::mesh::make_mesh(2, 2, 1, 1), {});
  check_round(2, 2, dtrain::mesh::make_mesh(2, 2, 1, 1), {});
  check_round(4, 2, dtrain::mesh::make_mesh(2, 2, 2, 1), {3, 2, 1, 0});  // requested node ranks are honoured
}

TEST_CASE("rendezvous: wrong token, wrong job, duplicate node, too many nodes") {
  TestServer s(server_options(2, 2, dtrain::mesh::make_mesh(4, 1, 1, 1)));
  Error bad_token = join_error(s, agent(0, 2), "not-the-token");
  CHECK(bad_token.code() == ErrorCode::rendezvous);
  // Another token derives another certificate: the agent refuses the server
  // at the TLS handshake, before it sends the token (the server's own check
  // is reached in CA mode: tls_test.cpp).
  CHECK(std::string(bad_token.message()).find("not derived from this agent's token (wrong token") !=
        std::string::npos);
  CHECK_THROWS_AS(s.client("").status(), Error);  // missing token: refused too
  Error bad_job = join_error(s, agent(0, 2), kToken, "job-b");
  CHECK(bad_job.message().find("'job-a'") != std::string::npos);
  CHECK(bad_job.message().find("'job-b'") != std::string::npos);
  CHECK(s.client().status().nodes.empty());  // refused callers hold no place

  auto first = join_async(s, agent(0, 2, 0));
  wait_for_waiting(s, 1);
  Error dup = join_error(s, agent(0, 2));
  CHECK(dup.code() == ErrorCode::rendezvous);
  CHECK(dup.message().find("duplicate node") != std::string::npos);
  Error dup_rank = join_error(s, agent(1, 2, 0));
  CHECK(dup_rank.message().find("node_rank 0 is already taken") != std::string::npos);
  Assignment second = s.client().join(agent(1, 2), 5);
  CHECK(first.get().node_rank == 0);
  CHECK(second.node_rank == 1);

  Error extra = join_error(s, agent(2, 2));
  CHECK(extra.code() == ErrorCode::rendezvous);
  CHECK(extra.message().find("too many nodes") != std::string::npos);
  CHECK(extra.message().find("max nodes = 2") != std::string::npos);
}

TEST_CASE("rendezvous: join timeout says how many nodes joined") {
  TestServer s(server_options(2, 2, dtrain::mesh::make_mesh(2, 1, 1, 1)));
  // Two joins with a short and a 10x longer timeout: each returns when its
  // own timeout ends (compared with each other, not with a fixed bound).
  double took[2];
  const double timeout_s[2] = {0.2, 2.0};
  for (int i = 0; i < 2; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Error e = join_error(s, agent(0, 1), kToken, "job-a", timeout_s[i]);
    took[i] = Seconds(std::chrono::steady_clock::now() - t0).count();
    CHECK(e.code() == ErrorCode::timeout);
    CHECK(e.message().find("joined 1 of 2") != std::string::npos);
    CHECK(s.client().status().nodes.empty());  // the timed-out agent left the round
  }
  MESSAGE("join timed out after " << took[0] << " s (timeout 0.2 s) and " << took[1] << " s (2 s)");
  CHECK(took[0] >= timeout_s[0]);
  CHECK(took[1] >= timeout_s[1]);
  CHECK(took[0] < took[1] / 2);  // 10x expected: a timeout not passed through makes them alike
}

TEST_CASE("rendezvous: elastic min:max closes at min after the last call") {
  TestServer s(server_options(2, 4, dtrain::mesh::make_mesh(1, 1, 1, 1)));
  auto t0 = std::chrono::steady_clock::now();
  auto a = join_async(s, agent(0, 1));
  auto b = join_async(s, agent(1, 1));
  Assignment ra = a.get(), rb = b.get();
  double took = Seconds(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.3);
  CHECK(ra.num_nodes == 2);
  CHECK(ra.mesh.dp() == 2);  // dp scales with the nodes that came
  CHECK(rb.world == 2);
}

TEST_CASE("rendezvous: a node that stops beating is declared dead; a new round opens, no restart") {
  TestServer s(server_options(2, 2, dtrain::mesh::make_mesh(2, 1, 1, 1)));
  auto a = join_async(s, agent(0, 1));
  Assignment rb = s.client().join(agent(1, 1), 5);
  Assignment ra = a.get();
  REQUIRE(ra.round == rb.round);
  // node-0 keeps beating every 0.1 s; node-1 went silent after joining.
  auto c = s.client();
  auto t0 = std::chrono::steady_clock::now();
  HeartbeatReply hb;
  double took = 0;
  while (took < 30.0) {
    hb = c.heartbeat("node-0", ra.round);
    took = Seconds(std::chrono::steady_clock::now() - t0).count();
    if (hb.current_round != ra.round) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  MESSAGE("death detected after " << took << " s (heartbeat 0.2 s)");
  // The loop's 30 s are a hang guard only: the 3-interval window itself is
  // checked on an injected clock (rendezvous_round_test.cpp, "heartbeat death").
  CHECK(hb.known);
  CHECK_MESSAGE(hb.current_round == ra.round + 1, "node-1 not declared dead within the " << took << " s hang guard");
  ServerStatus st = c.status();
  CHECK(st.restart == 0);  // a membership change is not a restart
  CHECK(st.round_open);
  CHECK_FALSE(c.heartbeat("node-1", ra.round).known);
}

TEST_CASE("rendezvous: a waiting heartbeat is answered when the round moves on") {
  TestServer s(server_options(2, 2, dtrain::mesh::make_mesh(2, 1, 1, 1)));
  auto a = join_async(s, agent(0, 1));
  Assignment rb = s.client().join(agent(1, 1), 5);
  Assignment ra = a.get();
  REQUIRE(ra.round == rb.round);
  auto c = s.client();
  // Nothing happens meanwhile: the beat is answered at its wait's end (a
  // server that never answered would leave it to the client's deadline, an error).
  CallCancel never;
  auto quiet = c.wait_heartbeat("node-0", ra.round, {}, 0.3, never);
  REQUIRE(quiet);
  CHECK(quiet->current_round == ra.round);
  // A beat that may wait 30 s; once the server holds it, node-1 reports a
  // failure: the held beat is answered with the new round.
  auto held = std::async(std::launch::async, [&] {
    CallCancel cancel;
    return s.client().wait_heartbeat("node-0", ra.round, {}, 30, cancel);
  });
  int polls = 0;  // hang guard only (30 s)
  while (c.status().waiting_heartbeats < 1 && held.wait_for(std::chrono::seconds(0)) != std::future_status::ready &&
         ++polls < 6000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  FailureReport f;
  f.round = ra.round;
  f.exit_code = 1;
  f.node_id = "node-1";
  c.report_failure(f);
  auto hb = held.get();
  REQUIRE(hb);
  MESSAGE("held beat answered with round " << hb->current_round << " (joined in " << ra.round << ")");
  CHECK_MESSAGE(hb->current_round == ra.round + 1, "the beat was answered before the round moved on");
  CHECK(hb->known);
  CHECK(c.status().waiting_heartbeats == 0);
}

TEST_CASE("rendezvous: ReportFailure restarts once per round") {
  TestServer s(server_options(2, 2, dtrain::mesh::make_mesh(2, 1, 1, 1)));
  auto a = join_async(s, agent(0, 1));
  Assignment rb = s.client().join(agent(1, 1), 5);
  Assignment ra = a.get();
  FailureReport f;
  f.round = ra.round;
  f.rank = 0;
  f.exit_code = 1;
  f.node_id = "node-0";
  s.client().report_failure(f);
  f.node_id = "node-1";
  s.client().report_failure(f);  // the same failure, seen by the other agent
  ServerStatus st = s.client().status();
  CHECK(st.restart == 1);
  CHECK(st.round == ra.round + 1);
  CHECK(s.client().heartbeat("node-1", rb.round).current_round == ra.round + 1);
  auto a2 = join_async(s, agent(0, 1));
  Assignment rb2 = s.client().join(agent(1, 1), 5);
  CHECK(a2.get().restart == 1);
  CHECK(rb2.round == ra.round + 1);
}

TEST_CASE("rendezvous: a late joiner waits for the next round") {
  TestServer s(server_options(1, 2, dtrain::mesh::make_mesh(1, 1, 1, 1)));  // elastic 1:2, last call 0.3 s
  Assignment first = s.client().join(agent(0, 1), 5);
  CHECK(first.num_nodes == 1);
  auto late = join_async(s, agent(1, 1));
  // The running node learns of the new round from its heartbeat and re-joins
  // (polled; the 30 s are a hang guard only).
  auto c = s.client();
  HeartbeatReply hb;
  for (int i = 0; i < 6000 && (hb = c.heartbeat("node-0", first.round)).current_round ==
                                 first.round; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(hb.current_round == first.round + 1);
  Assignment again = c.join(agent(0, 1), 5);
  Assignment second = late.get();
  CHECK(second.round == first.round + 1);
  CHECK(second.num_nodes == 2);
  CHECK(again.num_nodes == 2);
  CHECK(second.restart == 0);
}

TEST_CASE("rendezvous: a clean leave opens no round; shutdown answers waiting joins") {
  TestServer s(server_options(1, 1, dtrain::mesh::make_mesh(1, 1, 1, 1)));
  Assignment a = s.client().join(agent(0, 1), 5);
  s.client().leave("node-0", true);
  ServerStatus st = s.client().status();
  CHECK(st.round == a.round);
  CHECK_FALSE(st.round_open);

  TestServer t(server_options(2, 2, dtrain::mesh::make_mesh(2, 1, 1, 1)));
  auto waiting = join_async(t, agent(0, 1));
  wait_for_waiting(t, 1);
  t.server.shutdown();
  CHECK_THROWS_AS(waiting.get(), Error);
}

TEST_CASE("rendezvous: no server gives a clear error") {
  std::string endpoint;
  {
    TestServer gone(server_options(1, 1, dtrain::mesh::make_mesh(1, 1, 1, 1)));
    endpoint = gone.endpoint;
  }
  ClientOptions c;
  c.endpoint = endpoint;
  c.token = kToken;
  c.job = "job-a";
  c.call_timeout_s = 2;
  try {
    RendezvousClient(c).status();
    FAIL("status without a server did not fail");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::rendezvous);
    CHECK(e.message().find(endpoint) != std::string::npos);
    CHECK(e.message().find("is the rendezvous server running?") != std::string::npos);
  }
}

TEST_CASE("token: constant-time compare, env before file, clear errors") {
  CHECK(tokens_equal("abc", "abc"));
  CHECK_FALSE(tokens_equal("abc", "abd"));
  CHECK_FALSE(tokens_equal("abc", "abcd"));
  CHECK_FALSE(tokens_equal("abc", ""));
  CHECK(tokens_equal("", ""));
  CHECK(random_token().size() == 32);
  CHECK(random_token() != random_token());

  const char* saved = std::getenv("DTRAIN_TOKEN");
  std::string saved_value = saved ? saved : "";
  unsetenv("DTRAIN_TOKEN");
  char dir[] = "/tmp/dtrain-token-unit-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/token.txt";
  std::ofstream(path) << "  from-file\n";
  CHECK(read_token(path) == "from-file");
  setenv("DTRAIN_TOKEN", "from-env", 1);
  CHECK(read_token(path) == "from-env");
  unsetenv("DTRAIN_TOKEN");
  std::remove(path.c_str());
  ::rmdir(dir);
  CHECK_THROWS_WITH_AS(read_token(path), doctest::Contains("cannot read"), Error);
  CHECK_THROWS_AS(read_token(""), Error);
  CHECK(read_token("", false).empty());
  if (saved) setenv("DTRAIN_TOKEN", saved_value.c_str(), 1);
}
