// RoundState without sockets or sleeps: the clock is passed in, so node
// ordering, last call, heartbeat death and restart counting are checked at
// exact instants. The gRPC side is rendezvous_test.cpp.
#include <doctest/doctest.h>

#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using std::chrono::milliseconds;

namespace {

ServerOptions round_options(int min_nodes, int max_nodes) {
  ServerOptions o;
  o.token = "t";
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.mesh.size(dtrain::mesh::Axis::dp) = max_nodes;
  o.last_call_s = 1.0;
  o.heartbeat_s = 1.0;
  return o;
}

JoinInfo node(int i, int node_rank = -1) {
  JoinInfo j;
  j.node_id = "n" + std::to_string(i);
  j.host = "h" + std::to_string(i);
  j.node_rank = node_rank;
  return j;
}

// Round 1's failure of `rank` (local rank 0) on node `node_id`; the caller
// sets its exit code or signal.
FailureReport failure(const std::string& node_id, int rank, const std::string& message, double at) {
  FailureReport f;
  f.node_id = node_id;
  f.round = 1;
  f.rank = rank;
  f.local_rank = 0;
  f.message = message;
  f.failed_at = at;
  return f;
}

}  // namespace

TEST_CASE("round: requested node ranks first, then join order fills the gaps") {
  RoundState s(round_options(3, 3));
  TimePoint t0{};
  CHECK_FALSE(s.join(node(0), 1, t0, TimePoint::max()));
  CHECK_FALSE(s.join(node(1, 0), 2, t0, TimePoint::max()));
  CHECK(s.poll(t0).empty());
  CHECK_FALSE(s.join(node(2), 3, t0, TimePoint::max()));
  auto out = s.poll(t0);
  REQUIRE(out.size() == 3);
  std::vector<std::string> order = out.front().closed->node_ids;
  CHECK(order == std::vector<std::string>{"n1", "n0", "n2"});
  CHECK(out.front().closed->master_addr == "h1");
  CHECK_FALSE(s.open());
}

TEST_CASE("round: elastic last call, heartbeat death, one restart per failure") {
  RoundState s(round_options(1, 2));
  TimePoint t0{};
  CHECK_FALSE(s.join(node(0), 1, t0, TimePoint::max()));
  CHECK(s.poll(t0 + milliseconds(999)).empty());  // last call still running
  auto out = s.poll(t0 + milliseconds(1000));
  REQUIRE(out.size() == 1);
  CHECK(out[0].closed->placement.mesh.dp() == 1);  // dp scales to what came

  TimePoint t1 = t0 + milliseconds(1000);
  CHECK(s.heartbeat("n0", 1, t1 + milliseconds(2500)).known);
  s.poll(t1 + milliseconds(5400));  // 2.9 s after the beat: alive
  CHECK(s.round() == 1);
  s.poll(t1 + milliseconds(5600));  // 3.1 s: dead, new round, no restart
  CHECK(s.round() == 2);
  CHECK(s.status(t1).restart == 0);
  CHECK_FALSE(s.heartbeat("n0", 1, t1).known);

  CHECK_FALSE(s.join(node(1), 2, t1, TimePoint::max()));
  CHECK_FALSE(s.join(node(2), 3, t1, TimePoint::max()));
  REQUIRE(s.poll(t1).size() == 2);  // max reached: no last call
  FailureReport f;
  f.round = 2;
  f.node_id = "n1";
  s.report_failure(f);
  f.node_id = "n2";
  s.report_failure(f);
  CHECK(s.status(t1).restart == 1);
  CHECK(s.round() == 3);
}

TEST_CASE("round: an expired join is answered with K of M and leaves the round") {
  RoundState s(round_options(2, 2));
  TimePoint t0{};
  CHECK_FALSE(s.join(node(0), 1, t0, t0 + milliseconds(500)));
  auto out = s.poll(t0 + milliseconds(500));
  REQUIRE(out.size() == 1);
  CHECK(out[0].refusal.kind == RefusalKind::deadline);
  CHECK(out[0].refusal.message.find("timed out after 0.5 s: joined 1 of 2 nodes") !=
        std::string::npos);
  CHECK(s.status(t0).nodes.empty());
}

TEST_CASE("round: the earliest failure of a round is its root cause, whatever order the reports arrive in") {
  RoundState s(round_options(2, 2));
  TimePoint t0{};
  JoinInfo a = node(0), b = node(1);
  a.hostname = "vm-a";
  b.hostname = "vm-b";
  CHECK_FALSE(s.join(a, 1, t0, TimePoint::max()));
  CHECK_FALSE(s.join(b, 2, t0, TimePoint::max()));
  REQUIRE(s.poll(t0).size() == 2);
  // n0's rank broke on n1's failure, and said so first.
  FailureReport peer = failure("n0", 0, "in step 3: Connection closed by peer", 1000.4);
  peer.exit_code = 1;
  s.report_failure(peer);
  CHECK(s.status(t0).failure.find("rank 0 (local rank 0) on node 0 (h0, hostname vm-a, id 'n0')") == 0);
  FailureReport cause = failure("n1", 1, "in step 3: boom", 1000.1);
  cause.signal = 6;
  s.report_failure(cause);
  const std::string failure = s.status(t0).failure;
  CHECK(failure == "rank 1 (local rank 0) on node 1 (h1, hostname vm-b, id 'n1') failed: signal 6 (SIGABRT): in step 3: boom");
  CHECK(s.status(t0).restart == 1);  // one failure of one round: one restart
  CHECK(s.round() == 2);
  peer.failed_at = 1000.2;  // later than the kept one: ignored
  s.report_failure(peer);
  CHECK(s.status(t0).failure == failure);
}

TEST_CASE("round: a permanent failure (a worker's config error) marks the job stopped for every node") {
  for (bool permanent : {false, true}) {
    CAPTURE(permanent);
    RoundState s(round_options(2, 2));
    TimePoint t0{};
    CHECK_FALSE(s.join(node(0), 1, t0, TimePoint::max()));
    CHECK_FALSE(s.join(node(1), 2, t0, TimePoint::max()));
    REQUIRE(s.poll(t0).size() == 2);
    FailureReport f = failure("n0", 0, "in step 4: data.path = 'x' changed while training", 1000.3);
    f.permanent = permanent;
    s.report_failure(f);
    CHECK(s.status(t0).stopped == permanent);  // a crash: the nodes re-join for a restart
    CHECK(s.status(t0).failure.find("changed while training") != std::string::npos);
    CHECK(s.round() == 2);
    // A node re-joining for a restart is refused once the job stopped.
    const Refusal rejoin = s.join(node(1), 3, t0, TimePoint::max());
    CHECK(bool(rejoin) == permanent);
    if (permanent) CHECK(rejoin.message.find("the job stopped without a restart: rank 0") == 0);
  }
}

TEST_CASE("round: a node that stops beating while the round re-forms after its peers' failure is named as lost, "
          "and as that failure's cause") {
  // A node agent is killed: its workers die with it, their peers fail on
  // the broken connections ("Connection reset by peer") and report first.
  // The killed node never re-joins and never beats again.
  ServerOptions o = round_options(2, 3);
  o.heartbeat_s = 0.5;
  o.last_call_s = 5;
  RoundState s(o);
  TimePoint t0{};
  for (int i = 0; i < 3; ++i) CHECK_FALSE(s.join(node(i, i), uint64_t(i + 1), t0, TimePoint::max()));
  REQUIRE(s.poll(t0).size() == 3);
  const uint64_t round = s.round();
  auto at = [&](int ms) { return t0 + milliseconds(ms); };
  for (int i = 0; i < 3; ++i) s.heartbeat("n" + std::to_string(i), round, at(400));
  FailureReport f = failure("n0", 0, "in step 9: all_reduce on group dp failed: Connection reset by peer", 1000.6);
  f.exit_code = 1;
  s.report_failure(f);
  REQUIRE(s.open());
  for (int i = 0; i < 2; ++i) s.heartbeat("n" + std::to_string(i), round, at(1000));  // stopping their workers
  s.heartbeat("n1", round, at(1900));  // n1's workers take longer to stop
  CHECK_FALSE(s.join(node(0, 0), 4, at(1100), TimePoint::max()));
  CHECK(s.poll(at(1800)).empty());  // n2 silent 1.4 s < 3 beats
  CHECK(s.status(at(1800)).failure.find("Connection reset by peer") != std::string::npos);
  CHECK(s.poll(at(2000)).empty());  // 1.6 s: n2 is lost (n1 beats, n0 re-joined)
  const std::string why = s.status(at(2000)).failure;
  INFO(why);
  CHECK(why.find("node 'n2' missed 3 heartbeats (1.5 s) and is declared dead") == 0);
  CHECK(why.find("\n  lost node 2: id 'n2', address h2, last heartbeat 1.6 s ago") != std::string::npos);
  CHECK(why.find("\n  the failure it caused: rank 0 (local rank 0) on node 0 (h0, id 'n0') failed: exit code 1") !=
        std::string::npos);
  CHECK_FALSE(s.join(node(1, 1), 5, at(2100), TimePoint::max()));
  auto out = s.poll(at(2100));  // every survivor is back: no last call (5 s) to wait for n2
  REQUIRE(out.size() == 2);
  CHECK(out.front().closed->node_ids == std::vector<std::string>{"n0", "n1"});
  CHECK(s.status(at(2100)).restart == 1);  // one failure, one restart
}
