// HeldBeats, the server's held heartbeats, without a server or a clock: a
// beat is answered when the round moves on or its wait ends, exactly once,
// and a cancelled one never. (End to end: rendezvous_test.cpp.)
#include <doctest/doctest.h>

#include <set>

#include "rendezvous/held_beats.h"

using namespace dtrain::rendezvous;
using std::chrono::seconds;

namespace {

std::set<int> handles(const std::vector<HeldBeats<int>::Beat>& beats) {
  std::set<int> out;
  for (const auto& b : beats) out.insert(b.handle);
  return out;
}

}  // namespace

TEST_CASE("held beats: answered at their wait's end, all at once when the round moves on") {
  HeldBeats<int> held;
  const TimePoint t0{};
  held.hold(1, 10, "n0", 4, t0 + seconds(1));
  held.hold(2, 20, "n1", 4, t0 + seconds(2));
  held.hold(3, 30, "n2", 4, t0 + seconds(3));
  CHECK(held.due(4, t0).empty());  // same round, no wait over
  CHECK(handles(held.due(4, t0 + seconds(1))) == std::set<int>{10});
  int cancelled = 0;
  CHECK(held.drop(2, &cancelled));
  CHECK(cancelled == 20);
  CHECK_FALSE(held.drop(1, &cancelled));  // answered already: not twice
  CHECK(held.size() == 1);
  held.hold(4, 40, "n1", 4, t0 + seconds(30));
  // The round moves on: every held beat now, whatever its wait.
  CHECK(handles(held.due(5, t0 + seconds(2))) == std::set<int>{30, 40});
  CHECK(held.size() == 0);
  CHECK(held.due(5, t0 + seconds(60)).empty());  // stale deadlines answer nothing
  held.hold(5, 50, "n0", 5, t0 + seconds(61));
  CHECK(handles(held.take_all()) == std::set<int>{50});
}
