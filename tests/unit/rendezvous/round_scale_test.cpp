// RoundState at scale without a clock: joins, withdrawals, heartbeats and
// timeouts of thousands of nodes must each examine O(1) entries amortised.
// RoundState counts the entries it examines (scanned()), so a per-join scan
// of the waiting list (quadratic in the round's size) fails here on entry
// counts, never on wall-clock time.
#include <doctest/doctest.h>

#include "common/log.h"
#include "rendezvous/round_state.h"

using namespace dtrain::rendezvous;
using std::chrono::seconds;

namespace {

constexpr int kNodes = 4096;
// Entries examined per operation, amortised: generous for any O(1) scheme
// (heap pops, stale entries), far below the kNodes / 2 of a linear scan.
constexpr uint64_t kPerOp = 8;

ServerOptions scale_options(int nodes) {
  ServerOptions o;
  o.token = "t";
  o.min_nodes = o.max_nodes = nodes;
  o.mesh.size(dtrain::mesh::Axis::dp) = nodes;
  o.heartbeat_s = 1.0;
  return o;
}

JoinInfo scale_node(int i, int node_rank = -1) {
  JoinInfo j;
  j.node_id = "n" + std::to_string(i);
  j.host = "h" + std::to_string(i);
  j.node_rank = node_rank;
  return j;
}

}  // namespace

TEST_CASE("round scale: 4096 joins (each polled, as the server does) examine O(1) entries each") {
  RoundState s(scale_options(kNodes));
  const TimePoint t0{};
  uint64_t ops = 0;
  size_t answered = 0;
  for (int i = 0; i < kNodes; ++i) {
    // every joiner with a deadline, as agents send one; half ask for a node rank
    const TimePoint expiry = t0 + seconds(600 + i);
    REQUIRE_FALSE(s.join(scale_node(i, i % 2 ? i : -1), static_cast<uint64_t>(i + 1), t0, expiry));
    // a duplicate id and a duplicate rank are still refused
    if (i == kNodes / 2) {
      CHECK(s.join(scale_node(0), 99999, t0, expiry).kind == RefusalKind::exists);
      CHECK(s.join(scale_node(kNodes + 1, 1), 99998, t0, expiry).kind == RefusalKind::exists);
      ops += 2;
    }
    s.heartbeat("n" + std::to_string(i / 2), 1, t0);
    answered += s.poll(t0).size();
    ops += 3;
  }
  CHECK(answered == size_t(kNodes));
  CHECK_FALSE(s.open());
  MESSAGE("entries examined: " << s.scanned() << " for " << ops << " operations (bound "
                               << kPerOp * ops << ")");
  CHECK(s.scanned() <= kPerOp * ops);
}

TEST_CASE("round scale: 4096 waiting joiners that withdraw or time out examine O(1) entries each") {
  RoundState s(scale_options(kNodes + 1));  // never fills: every joiner leaves one way or the other
  using dtrain::log::Level;
  const Level was = dtrain::log::enabled(Level::debug)  ? Level::debug
                    : dtrain::log::enabled(Level::info) ? Level::info
                    : dtrain::log::enabled(Level::warn) ? Level::warn
                                                        : Level::error;
  dtrain::log::set_level(Level::error);  // not 2048 timeout warnings
  const TimePoint t0{};
  uint64_t ops = 0;
  for (int i = 0; i < kNodes; ++i) {
    REQUIRE_FALSE(s.join(scale_node(i), static_cast<uint64_t>(i + 1), t0, t0 + seconds(10 + i)));
    CHECK(s.poll(t0).empty());
    ops += 2;
  }
  // Every odd joiner withdraws; the even ones time out one poll at a time,
  // in deadline order.
  for (int i = 1; i < kNodes; i += 2) s.withdraw(static_cast<uint64_t>(i + 1));
  ops += kNodes / 2;
  size_t timed_out = 0;
  for (int i = 0; i < kNodes; i += 2) {
    auto out = s.poll(t0 + seconds(10 + i));
    REQUIRE(out.size() == 1);
    CHECK(out.front().ticket == static_cast<uint64_t>(i + 1));
    CHECK(out.front().refusal.kind == RefusalKind::deadline);
    timed_out += out.size();
    ++ops;
  }
  dtrain::log::set_level(was);
  CHECK(timed_out == size_t(kNodes / 2));
  CHECK(s.status(t0).nodes.empty());
  // An id that withdrew may join again.
  CHECK_FALSE(s.join(scale_node(1), 100000, t0, TimePoint::max()));
  MESSAGE("entries examined: " << s.scanned() << " for " << ops << " operations (bound "
                               << kPerOp * ops << ")");
  CHECK(s.scanned() <= kPerOp * ops);
}
