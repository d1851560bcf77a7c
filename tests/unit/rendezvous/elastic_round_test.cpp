// Elastic shrink and grow in RoundState, at exact instants (no sockets, no
// sleeps): a dead node's round re-forms on the survivors with a smaller dp
// as soon as they are all back (a first round waits for the last call),
// a node that comes back is admitted at the next round, and with
// grad_accum: auto a round whose dp does not divide the global batch is
// refused with the values and the fix.
#include <doctest/doctest.h>

#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using std::chrono::milliseconds;

namespace {

ServerOptions elastic_options(int global_batch) {
  ServerOptions o;
  o.token = "t";
  o.min_nodes = 2;
  o.max_nodes = 3;
  o.mesh.size(dtrain::mesh::Axis::dp) = 3;
  o.last_call_s = 1.0;
  o.heartbeat_s = 0.5;
  o.grad_accum_auto = true;
  o.global_batch = global_batch;
  o.micro_batch = 2;
  return o;
}

JoinInfo node(const std::string& id, int node_rank) {
  JoinInfo j;
  j.node_id = id;
  j.host = "10.0.0." + std::to_string(node_rank + 10);
  j.hostname = "vm";
  j.node_rank = node_rank;
  return j;
}

}  // namespace

TEST_CASE("elastic round: 3 -> 2 nodes on a lost heartbeat, then 3 again when the node comes back") {
  RoundState s(elastic_options(12));
  TimePoint t{};
  for (int i = 0; i < 3; ++i)
    CHECK_FALSE(s.join(node("n" + std::to_string(i), i), uint64_t(i + 1), t, TimePoint::max()));
  auto out = s.poll(t);
  REQUIRE(out.size() == 3);
  CHECK(out[0].closed->placement.mesh.dp() == 3);

  // n2 stops beating; n0 and n1 keep going. 3 x 0.5 s later n2 is dead.
  for (int k = 1; k <= 4; ++k) {
    t += milliseconds(400);
    s.heartbeat("n0", 1, t);
    s.heartbeat("n1", 1, t);
    s.poll(t);
  }
  CHECK(s.round() == 2);  // 1.6 s > 1.5 s after n2's last beat
  const ServerStatus st = s.status(t);
  CHECK(st.failure.find("lost node 2: id 'n2', address 10.0.0.12, hostname vm, last heartbeat 1.6 s ago") !=
        std::string::npos);
  CHECK(st.restart == 0);  // a membership change, not a failure

  // The survivors re-join; once both are back nobody else is expected: the
  // round closes at once, without the last call.
  CHECK_FALSE(s.join(node("n0", 0), 4, t, TimePoint::max()));
  CHECK_FALSE(s.join(node("n1", 1), 5, t, TimePoint::max()));
  out = s.poll(t);
  REQUIRE(out.size() == 2);
  CHECK(out[0].closed->placement.mesh.dp() == 2);
  CHECK(out[0].closed->round == 2);
  t += milliseconds(1000);

  // The lost node comes back (a new agent: a new id): the next round admits it.
  CHECK_FALSE(s.join(node("n2b", 2), 6, t, TimePoint::max()));
  CHECK(s.round() == 3);
  CHECK(s.open());
  CHECK(s.heartbeat("n0", 2, t).current_round == 3);  // the survivors are told to re-join
  CHECK_FALSE(s.join(node("n0", 0), 7, t, TimePoint::max()));
  CHECK_FALSE(s.join(node("n1", 1), 8, t, TimePoint::max()));
  out = s.poll(t);  // max reached: no last call
  REQUIRE(out.size() == 3);
  CHECK(out[0].closed->placement.mesh.dp() == 3);
  CHECK(out[0].closed->node_ids == std::vector<std::string>{"n0", "n1", "n2b"});
}

TEST_CASE("elastic round: a first round at min waits for the last call; a survivor still missing is waited for") {
  RoundState s(elastic_options(12));
  TimePoint t{};
  CHECK_FALSE(s.join(node("n0", 0), 1, t, TimePoint::max()));
  CHECK_FALSE(s.join(node("n1", 1), 2, t, TimePoint::max()));
  CHECK(s.poll(t + milliseconds(999)).empty());  // nobody to wait for is known: the last call
  REQUIRE(s.poll(t + milliseconds(1000)).size() == 2);
  t += milliseconds(1000);
  CHECK_FALSE(s.join(node("n2", 2), 3, t, TimePoint::max()));  // scale-up: round 2 opens
  CHECK(s.round() == 2);
  CHECK_FALSE(s.join(node("n0", 0), 4, t, TimePoint::max()));
  CHECK(s.poll(t).empty());  // n1 of the last round is alive and not back yet
  CHECK_FALSE(s.join(node("n1", 1), 5, t, TimePoint::max()));
  CHECK(s.poll(t).size() == 3);
}

TEST_CASE("elastic round: grad_accum auto refuses a round whose dp does not divide the global batch") {
  RoundState s(elastic_options(8));  // dp 2: 8 / (2 x 2) = 2; dp 3: 8 / 6 no
  TimePoint t{};
  for (int i = 0; i < 3; ++i)
    CHECK_FALSE(s.join(node("n" + std::to_string(i), i), uint64_t(i + 1), t, TimePoint::max()));
  auto out = s.poll(t);
  REQUIRE(out.size() == 3);
  for (const auto& o : out) {
    CHECK(o.refusal.kind == RefusalKind::precondition);
    CHECK(o.refusal.message.find("round 1 cannot be placed: train.grad_accum = auto: "
                                 "train.global_batch(8) is not a multiple of train.micro_batch(2) x "
                                 "parallel.dp(3) = 6; use train.global_batch 6 or 12") !=
          std::string::npos);
  }
  // Two nodes fit: the same server forms that round.
  CHECK_FALSE(s.join(node("n0", 0), 4, t, TimePoint::max()));
  CHECK_FALSE(s.join(node("n1", 1), 5, t, TimePoint::max()));
  out = s.poll(t + milliseconds(1000));
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].closed);
  CHECK(out[0].closed->placement.mesh.dp() == 2);
}

TEST_CASE("elastic round: a fixed grad_accum with train.global_batch refuses a round that changes it") {
  ServerOptions o = elastic_options(12);
  o.grad_accum_auto = false;
  o.grad_accum = 2;  // 2 x 2 x 3 = 12 on 3 nodes; 8 on 2
  RoundState s(o);
  TimePoint t{};
  CHECK_FALSE(s.join(node("n0", 0), 1, t, TimePoint::max()));
  CHECK_FALSE(s.join(node("n1", 1), 2, t, TimePoint::max()));
  auto out = s.poll(t + milliseconds(1000));
  REQUIRE(out.size() == 2);
  CHECK(out[0].refusal.kind == RefusalKind::precondition);
  CHECK(out[0].refusal.message.find("train.micro_batch(2) x train.grad_accum(2) x dp(2) = 8 != "
                                    "train.global_batch(12) (fix: set train.grad_accum: auto") !=
        std::string::npos);
}
