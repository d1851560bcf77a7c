// The agent's failure traffic with the rendezvous (agent.h): report_failure
// (this node's first failure; permanent when a restart would repeat it),
// server_status, and settled_failure: the job's root cause as the rendezvous
// keeps it (the earliest failure of the round, launcher/failure_origin.h),
// asked after the other nodes' reports had a moment to arrive. Prints nothing.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent.h"
#include "launcher/root_cause.h"

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

rendezvous::ServerStatus Agent::server_status() {
  try {
    return client_.status();
  } catch (const Error&) {
    return {};  // unknown: the join that follows will tell
  }
}

void Agent::report_failure(const Worker& worker, bool permanent) {
  rendezvous::FailureReport report;
  report.node_id = config_.node_id;
  report.round = group_.round;
  report.rank = worker.rank;
  report.local_rank = worker.local_rank;
  report.exit_code = worker.exit.exit_code;
  report.signal = worker.exit.signal;
  report.failed_at = failure_time(worker);
  report.permanent = permanent;
  if (!worker.error_file_text.empty()) report.message = error_file_report(worker.error_file_text);
  try {
    client_.report_failure(report);
  } catch (const Error& e) {
    DTRAIN_WARN("could not report the failure to the rendezvous: {}", e.message());
  }
}

}  // namespace dtrain::launcher
