// Agent::settled_failure (agent.h): the job's root cause as the rendezvous
// keeps it (the earliest failure of the round, launcher/failure_origin.h),
// asked after the other nodes' reports had a moment to arrive. Asks; prints nothing.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "launcher/agent.h"

namespace dtrain::launcher {

std::string Agent::settled_failure() const {
  // The failures of one round reach the rendezvous within moments of each
  // other, not always in the order they happened: give the others a moment.
  const double settle = std::clamp(spec_.cluster.rendezvous.heartbeat_s, 1.0, 2.0);
  std::this_thread::sleep_for(std::chrono::duration<double>(settle));
  try {
    return client_.status().failure;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace dtrain::launcher
