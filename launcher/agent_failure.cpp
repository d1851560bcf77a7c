// The agent's failure traffic with the rendezvous (agent.h): report_failure
// (this node's first failure; permanent when a restart would repeat it),
// server_status, and settled_failure: the job's root cause as the rendezvous
// keeps it (the earliest failure of the round, launcher/failure_origin.h),
// asked after the other nodes' reports had a moment to arrive; and what a
// remote round change means for this node's own workers. Prints nothing.
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
  // This node beats on meanwhile: it is a member of the round until it
  // leaves, and 3 silent intervals (its heartbeat thread ended with the
  // round) would get it declared dead, which the rendezvous would then
  // name as the root cause in place of its own worker's failure.
  using Clock = std::chrono::steady_clock;
  auto span = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  const double interval = spec_.cluster.rendezvous.heartbeat_s;
  const Clock::time_point until = Clock::now() + span(std::clamp(interval, 1.0, 2.0));
  for (Clock::time_point now = Clock::now(); now < until; now = Clock::now()) {
    try {
      client_.heartbeat(config_.node_id, group_.round, {});
    } catch (const Error&) {
    }
    std::this_thread::sleep_until(std::min(until, now + span(interval)));
  }
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

// The rendezvous answers a held beat the moment the round moves on, which
// can be before this agent reaped its own worker that failed first and
// broke the peer whose report moved it on (its sockets close while its
// exception unwinds; the process exits a moment later). Stopped as a
// bystander, that worker would go unreported and the job would name its
// victim. So own exits are reaped first, and a live worker whose error file
// predates the notice is awaited (it is exiting) for up to grace_s: either
// makes the round `failed`, reported as this node's failure (the rendezvous
// keeps the earlier report as the root cause, round_state.cpp).
Agent::Outcome Agent::after_round_change_notice() {
  notice_at_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& e : procs_->poll(0)) record_exit(e, /*stopping=*/false);
  auto failed_before_notice = [this](const Worker& w) {
    if (w.state != WorkerState::HEALTHY) return false;
    Worker probe = w;
    probe.error_file_text = read_error_file(w.spec.error_file);
    return !probe.error_file_text.empty() && failure_time(probe) < notice_at_;
  };
  bool pending = std::any_of(group_.workers.begin(), group_.workers.end(), failed_before_notice);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(spec_.cluster.grace_s);
  while (pending && std::chrono::steady_clock::now() < until) {
    for (const auto& e : procs_->poll(0.05)) record_exit(e, /*stopping=*/false);
    relay_->drain();
    pending = std::any_of(group_.workers.begin(), group_.workers.end(), failed_before_notice);
  }
  // Still running after grace_s: stop_step reaps it and, by the same
  // error-file time, records it as the first failure.
  auto outcome = pending ? std::optional<Outcome>(Outcome::failed) : group_outcome();
  // A round change is never this node's success, even where every worker's
  // exit reads as one (group_outcome holds "all succeeded" for no worker at
  // all): the agent re-joins, and the rendezvous says when the job is over.
  // Returning succeeded here made an agent leave the job as finished in the
  // middle of a round change (integ_chaos_test's campaign, link_cut).
  if (!outcome || *outcome == Outcome::succeeded) return Outcome::round_changed;
  if (*outcome == Outcome::failed)
    DTRAIN_WARN("the rendezvous moved to a new round, but a worker of this node had failed first: "
                "reporting it before re-joining");
  return *outcome;
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
