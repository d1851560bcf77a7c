// engine/checkpoint/fault.h: which rank a fault of the spec strikes, from
// which step, and on which launch. In-process, so only the kinds that return
// (slow, raise, and every kind where it must not strike) are run here; the killing
// and hanging ones run in tests/integration (checkpoint_test, safety_test).
#include <chrono>
#include <functional>

#include "engine/checkpoint/fault.h"

#include "tests/support/torch_doctest.h"

namespace {

using namespace dtrain::engine;

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("fault: slow sleeps fault.ms on fault.rank from fault.step on, first launch only") {
  dtrain::FaultSpec f;
  f.kind = dtrain::FaultKind::slow;
  f.rank = 1;
  f.step = 3;
  f.ms = 150;
  comm::WorldInfo info;
  info.rank = 1;
  info.world = 2;
  const double slept = seconds_of([&] { checkpoint::fault_in_step(f, info, 3); });
  MESSAGE("slow, rank 1, step 3: " << slept << " s (fault.ms " << f.ms << ")");
  CHECK(slept >= 0.150);

  // Not struck: an earlier step, another rank, a restarted run, another kind.
  // Each would take fault.ms if it slept.
  double others = seconds_of([&] { checkpoint::fault_in_step(f, info, 2); });
  info.rank = 0;
  others += seconds_of([&] { checkpoint::fault_in_step(f, info, 4); });
  info.rank = 1;
  info.restart = 1;
  others += seconds_of([&] { checkpoint::fault_in_step(f, info, 4); });
  info.restart = 0;
  for (dtrain::FaultKind kind : {dtrain::FaultKind::hang, dtrain::FaultKind::kill_after_step}) {
    f.kind = kind;
    others += seconds_of([&] { checkpoint::fault_in_step(f, info, 4); });
    others += seconds_of([&] { checkpoint::fault_after_step(f, info, 2); });  // not fault.step
  }
  MESSAGE("seven calls that must not sleep: " << others << " s together, the struck one " << slept << " s");
  CHECK(others < slept / 2);  // each would have slept as long as the struck one
}

TEST_CASE("fault: crash_during_save strikes the save of fault.step (0: the first) on fault.rank") {
  dtrain::FaultSpec f;
  f.kind = dtrain::FaultKind::crash_during_save;
  f.rank = 1;
  f.step = 20;
  comm::WorldInfo info;
  info.rank = 1;
  CHECK(checkpoint::crash_during_save(f, info, 20));
  CHECK_FALSE(checkpoint::crash_during_save(f, info, 10));
  f.step = 0;
  CHECK(checkpoint::crash_during_save(f, info, 10));
  info.rank = 0;
  CHECK_FALSE(checkpoint::crash_during_save(f, info, 10));
  info.rank = 1;
  info.restart = 1;
  CHECK_FALSE(checkpoint::crash_during_save(f, info, 10));
  info.restart = 0;
  f.kind = dtrain::FaultKind::slow;
  CHECK_FALSE(checkpoint::crash_during_save(f, info, 10));
}

TEST_CASE("fault: raise throws in step fault.step on fault.rank only, first launch only") {
  dtrain::FaultSpec f;
  f.kind = dtrain::FaultKind::raise;
  f.rank = 1;
  f.step = 3;
  comm::WorldInfo info;
  info.rank = 1;
  info.world = 2;
  CHECK_THROWS_WITH_AS(checkpoint::fault_in_step(f, info, 3),
                       "fault.kind = raise: rank 1 throws in step 3 on purpose (chaos testing)",
                       std::runtime_error);
  CHECK_NOTHROW(checkpoint::fault_in_step(f, info, 2));
  CHECK_NOTHROW(checkpoint::fault_in_step(f, info, 4));
  CHECK_NOTHROW(checkpoint::fault_after_step(f, info, 3));  // in the step, not after it
  info.restart = 1;
  CHECK_NOTHROW(checkpoint::fault_in_step(f, info, 3));
  info.restart = 0;
  info.rank = 0;
  CHECK_NOTHROW(checkpoint::fault_in_step(f, info, 3));
}
