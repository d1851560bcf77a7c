// Hang attribution without processes: progress records as agents report
// them, the round state's clock passed in. Who never entered the collective
// the others wait in, what it did last, and when a stall becomes a hang.
#include <doctest/doctest.h>

#include <array>
#include <functional>
#include <string>

#include "rendezvous/hang_attribution.h"
#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using dtrain::trace::RankProgress;
using std::chrono::milliseconds;

namespace {

// A rank that entered `entered` all-reduces on dp and completed `done`.
RankProgress rank_at(int rank, uint64_t entered, uint64_t done, int64_t step, const char* phase) {
  RankProgress p;
  p.rank = rank;
  p.entered = entered;
  p.completed = done;
  p.step = step;
  p.phase = phase;
  p.group_entered = {{"dp", entered}};
  if (done > 0) {
    p.has_done = true;
    p.last_done = {"dp", "all_reduce", done, 4096, 0, 1};
  }
  if (entered > done) {
    p.waiting = true;
    p.pending = {"dp", "all_reduce", done + 1, 4096, 0, 0};
  }
  return p;
}

// Nodes n0..n2 (hosts 10.0.0.0-2, node ranks 0-2) join at t0 and the round closes.
void join_three(RoundState& s, TimePoint t0) {
  for (int i = 0; i < 3; ++i) {
    JoinInfo j;
    j.node_id = "n" + std::to_string(i);
    j.host = "10.0.0." + std::to_string(i);
    j.node_rank = i;
    CHECK_FALSE(s.join(j, uint64_t(i + 1), t0, TimePoint::max()));
  }
  REQUIRE(s.poll(t0).size() == 3);
}

}  // namespace

TEST_CASE("hang: the rank that never entered the collective is named with its last one") {
  dtrain::mesh::Mesh mesh = dtrain::mesh::make_mesh(3, 1, 1, 1);
  std::map<int, RankProgress> ranks = {{0, rank_at(0, 13, 12, 6, "backward")},
                                       {1, rank_at(1, 13, 12, 6, "backward")},
                                       {2, rank_at(2, 12, 12, 5, "checkpoint")}};
  std::map<int, RankWhere> where = {{2, {2, "10.251.77.12", "vm"}}};
  HangReport h = attribute_hang(mesh, ranks, where, 10.5, 10);
  INFO(h.text);
  CHECK(h.waiting);
  CHECK(h.group == "dp");
  CHECK(h.op == "all_reduce");
  CHECK(h.seq == 13);
  CHECK(h.waiting_ranks == std::vector<int>{0, 1});
  CHECK(h.missing_ranks == std::vector<int>{2});
  CHECK(h.text.find("rank(s) 2 never entered it") != std::string::npos);
  CHECK(h.text.find("rank 2 on node 2 (10.251.77.12, vm): step 5, phase checkpoint, last completed "
                    "collective: dp all_reduce #12") != std::string::npos);
}

TEST_CASE("hang: everyone entered (a stuck link) is told apart from a missing rank") {
  dtrain::mesh::Mesh mesh = dtrain::mesh::make_mesh(2, 1, 1, 1);
  std::map<int, RankProgress> ranks = {{0, rank_at(0, 5, 4, 2, "backward")},
                                       {1, rank_at(1, 5, 4, 2, "backward")}};
  HangReport h = attribute_hang(mesh, ranks, {}, 3, 2);
  CHECK(h.missing_ranks.empty());
  CHECK(h.text.find("the collective itself is stuck") != std::string::npos);
}

TEST_CASE("hang: groups of the mesh, and world/control over every rank") {
  dtrain::mesh::Mesh mesh = dtrain::mesh::make_mesh(2, 2, 2, 1);  // 8 ranks: tp innermost, then dp, then pp
  CHECK(group_members(mesh, "tp", 5) == std::vector<int>{4, 5});
  CHECK(group_members(mesh, "dp", 5) == std::vector<int>{5, 7});
  CHECK(group_members(mesh, "pp", 5) == std::vector<int>{1, 5});
  CHECK(group_members(mesh, "world", 3).size() == 8);
  CHECK(group_members(mesh, "control", 0).size() == 8);
}

TEST_CASE("round: a stall longer than hang_timeout_s while ranks wait is a failure with a report") {
  ServerOptions o;
  o.token = "t";
  o.min_nodes = o.max_nodes = 3;
  o.mesh.size(dtrain::mesh::Axis::dp) = 3;
  o.heartbeat_s = 1;
  o.hang_timeout_s = 5;
  RoundState s(o);
  TimePoint t0{};
  join_three(s, t0);
  const uint64_t round = s.round();
  auto beat = [&](int sec, uint64_t e0, uint64_t d0, uint64_t e2) {
    TimePoint t = t0 + std::chrono::seconds(sec);
    s.heartbeat("n0", round, t, {rank_at(0, e0, d0, 6, "backward")});
    s.heartbeat("n1", round, t, {rank_at(1, e0, d0, 6, "backward")});
    s.heartbeat("n2", round, t, {rank_at(2, e2, e2, 5, "checkpoint")});
    s.poll(t);
  };
  beat(1, 10, 10, 10);  // everyone done with #10
  beat(2, 11, 10, 10);  // 0 and 1 wait in #11: progress stopped at t = 1 s
  beat(5, 11, 10, 10);
  CHECK_FALSE(s.open());  // 4 s of stall < 5 s
  beat(6, 11, 10, 10);
  CHECK(s.open());        // 5 s: a hang, the round ends, one restart counted
  ServerStatus st = s.status(t0 + std::chrono::seconds(6));
  CHECK(st.restart == 1);
  INFO(st.failure);
  CHECK(st.failure.find("rank(s) 0,1 wait in dp all_reduce #11") != std::string::npos);
  CHECK(st.failure.find("rank(s) 2 never entered it") != std::string::npos);
  CHECK(s.heartbeat("n0", round, t0 + std::chrono::seconds(7)).failure == st.failure);
}

TEST_CASE("round: no hang when ranks stall outside collectives, or when detection is off") {
  for (double timeout : {5.0, 0.0}) {
    ServerOptions o;
    o.token = "t";
    o.mesh.size(dtrain::mesh::Axis::dp) = 1;
    o.hang_timeout_s = timeout;
    o.heartbeat_s = 100;
    RoundState s(o);
    TimePoint t0{};
    JoinInfo j;
    j.node_id = "n0";
    j.host = "h";
    CHECK_FALSE(s.join(j, 1, t0, TimePoint::max()));
    REQUIRE(s.poll(t0).size() == 1);
    // timeout 5: computing (not waiting) for 60 s is no hang; timeout 0: waiting is none either.
    RankProgress p = rank_at(0, 3, timeout > 0 ? 3 : 2, 1, "forward");
    s.heartbeat("n0", s.round(), t0 + std::chrono::seconds(1), {p});
    s.poll(t0 + std::chrono::seconds(60));
    CHECK_FALSE(s.open());
  }
}

TEST_CASE("round: a rank that completes no collective within startup_timeout_s of the close hangs in start-up") {
  // Ranks 0 and 1 wait in their first collective; rank 2 was stopped while
  // starting and never reports. The stall check needs every rank started,
  // so without the start-up bound (0) nothing ever ends the round.
  for (double startup : {30.0, 0.0}) {
    ServerOptions o;
    o.token = "t";
    o.min_nodes = o.max_nodes = 3;
    o.mesh.size(dtrain::mesh::Axis::dp) = 3;
    o.heartbeat_s = 1;
    o.hang_timeout_s = 5;
    o.startup_timeout_s = startup;
    RoundState s(o);
    TimePoint t0{};
    join_three(s, t0);
    const uint64_t round = s.round();
    auto beat = [&](int sec) {
      TimePoint t = t0 + std::chrono::seconds(sec);
      s.heartbeat("n0", round, t, {rank_at(0, 1, 0, 0, "setup")});
      s.heartbeat("n1", round, t, {rank_at(1, 1, 0, 0, "setup")});
      s.heartbeat("n2", round, t, {});
      s.poll(t);
    };
    for (int sec = 1; sec < 30; ++sec) beat(sec);
    CHECK_FALSE(s.open());  // 29 s: still starting
    beat(30);
    beat(100);
    CAPTURE(startup);
    CHECK(s.open() == (startup > 0));
    if (startup == 0) continue;
    ServerStatus st = s.status(t0 + std::chrono::seconds(30));
    CHECK(st.restart == 1);
    INFO(st.failure);
    CHECK(st.failure.find("hang: rank(s) 2 completed no collective in the 30 s since round 1 closed") == 0);
    CHECK(st.failure.find("rank(s) 0,1 completed no collective either (they wait for it)") != std::string::npos);
    CHECK(st.failure.find("rank 2 on node 2 (10.0.0.2): no progress reported") != std::string::npos);
    CHECK(st.failure.find("rank 0 on") == std::string::npos);
  }
}

TEST_CASE("round: no start-up bound while no rank reports progress (an entrypoint without collective traces)") {
  ServerOptions o;
  o.token = "t";
  o.mesh.size(dtrain::mesh::Axis::dp) = 1;
  o.hang_timeout_s = 5;
  o.startup_timeout_s = 30;
  o.heartbeat_s = 1000;
  RoundState s(o);
  TimePoint t0{};
  JoinInfo j;
  j.node_id = "n0";
  j.host = "h";
  CHECK_FALSE(s.join(j, 1, t0, TimePoint::max()));
  REQUIRE(s.poll(t0).size() == 1);
  s.heartbeat("n0", s.round(), t0 + std::chrono::seconds(1), {});
  s.poll(t0 + std::chrono::seconds(600));
  CHECK_FALSE(s.open());
}

namespace {

// The stall (s) after which a 3-node round is declared hung: ranks 0 and 1
// wait in all_reduce #11 from t = 1 s, rank 2 is in `phase2`; each rank's
// last step took step_ms[rank] (0: no step timed yet). Beats every 0.5 s.
// cpu2_ms(t): rank 2's CPU time (ms) at t ms, as its agent reads it (none: 0, unknown).
double stall_at_hang(double steps, const char* phase2, std::array<int64_t, 3> step_ms, std::string* failure,
                     const std::function<int64_t(int)>& cpu2_ms = nullptr) {
  ServerOptions o;
  o.token = "t";
  o.min_nodes = o.max_nodes = 3;
  o.mesh.size(dtrain::mesh::Axis::dp) = 3;
  o.heartbeat_s = 0.5;
  o.hang_timeout_s = 5;
  o.hang_timeout_steps = steps;
  RoundState s(o);
  TimePoint t0{};
  join_three(s, t0);
  const uint64_t round = s.round();
  for (int ms = 500; ms <= 10000; ms += 500) {
    // Until 1 s all wait in #10; then #10 is done (the last progress) and 0, 1 wait in #11.
    const uint64_t done = ms >= 1000 ? 10 : 9;
    TimePoint t = t0 + milliseconds(ms);
    for (int r = 0; r < 3; ++r) {
      RankProgress p = rank_at(r, r < 2 ? done + 1 : 10, done, 6, r < 2 ? "backward" : phase2);
      p.start_step = 2;
      p.done_step = step_ms[size_t(r)] > 0 ? 5 : 2;
      p.last_step_ns = step_ms[size_t(r)] * 1000000;
      p.cpu_ns = 1000000000 + ms * 1000000LL;  // the waiting ranks poll: CPU time grows, they wait
      if (r == 2) p.cpu_ns = cpu2_ms ? (1000 + cpu2_ms(ms)) * 1000000LL : 0;
      s.heartbeat("n" + std::to_string(r), round, t, {p});
    }
    s.poll(t);
    if (s.open()) {
      *failure = s.status(t).failure;
      return (ms - 1000) / 1000.0;
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("round: cluster.hang_timeout_steps names a hang after that many of the slowest step, within its bounds") {
  std::string failure;
  // 5 x the slowest step (500 ms) = 2.5 s of stall, not hang_timeout_s's 5 s.
  CHECK(stall_at_hang(5, "forward", {400, 500, 300}, &failure) == 2.5);
  CHECK(failure.find("(cluster.hang_timeout_steps 5 x the slowest step 500 ms, at least 4 heartbeats = 2.5 s)") !=
        std::string::npos);
  CHECK(failure.find("rank(s) 0,1 wait in dp all_reduce #11") != std::string::npos);
  // Off: the fixed bound.
  CHECK(stall_at_hang(0, "forward", {400, 500, 300}, &failure) == 5);
  CHECK(failure.find("(cluster.hang_timeout_s = 5.0 s)") != std::string::npos);
  // Never over hang_timeout_s (3 x 2 s), never under four heartbeats (3 x 0.5 s,
  // 3 x 0.1 s): a node that misses three beats is named lost first.
  CHECK(stall_at_hang(3, "forward", {400, 2000, 300}, &failure) == 5);
  CHECK(stall_at_hang(3, "forward", {400, 500, 300}, &failure) == 2);
  CHECK(stall_at_hang(3, "forward", {100, 100, 100}, &failure) == 2);
  // The fixed bound while a rank saves, or before every rank timed a step.
  CHECK(stall_at_hang(3, "checkpoint", {400, 500, 300}, &failure) == 5);
  CHECK(stall_at_hang(3, "forward", {400, 500, 0}, &failure) == 5);
}

// A slow rank keeps the others waiting as a stopped one does; its CPU time,
// which its agent reads from /proc, tells them apart: the step-relative bound
// is for ranks that stopped, a rank still computing gets hang_timeout_s.
TEST_CASE("round: a rank whose CPU time still grows is slow, not hung: hang_timeout_steps waits for it") {
  std::string failure;
  // Stopped (SIGSTOP, a deadlock): no CPU time between beats, named after 5 x 500 ms.
  CHECK(stall_at_hang(5, "backward", {400, 500, 300}, &failure, [](int) { return 0; }) == 2.5);
  CHECK(failure.find("x the slowest step 500 ms, at least 4 heartbeats = 2.5 s)") != std::string::npos);
  // Computing at 10% of a core (a rank stopped 50 ms of every 60): only the
  // whole hang_timeout_s names it, and says why the step bound did not.
  CHECK(stall_at_hang(5, "backward", {400, 500, 300}, &failure, [](int ms) { return ms / 10; }) == 5);
  MESSAGE("a rank computing at 10% of a core: " << failure);
  CHECK(failure.find("(rank(s) 2 still computing, so not cluster.hang_timeout_steps 5 x the slowest step 500 ms, "
                     "at least 4 heartbeats, but cluster.hang_timeout_s = 5.0 s)") != std::string::npos);
  // Under 2% of the wall time (a stuck rank's helper threads): stopped.
  CHECK(stall_at_hang(5, "backward", {400, 500, 300}, &failure, [](int ms) { return ms / 100; }) == 2.5);
  // Computing until t = 3 s, then stuck: named 2.5 beats after its last
  // computing beat (t = 4.5 s, a stall of 3.5 s since the last collective).
  CHECK(stall_at_hang(5, "backward", {400, 500, 300}, &failure,
                      [](int ms) { return std::min(ms, 3000) / 10; }) == 3.5);
  // Unknown CPU time (an agent that does not read it): the step bound, as before.
  CHECK(stall_at_hang(5, "backward", {400, 500, 300}, &failure) == 2.5);
}
