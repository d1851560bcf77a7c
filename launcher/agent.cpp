// Agent (see agent.h). The signal relay is installed only while workers
// exist (start .. stop): between rounds dtrain has no children, so a
// SIGINT during a join may end it the default way without leaving any.
#include "launcher/agent.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "common/error.h"
#include "common/error_file.h"
#include "common/log.h"
#include "common/machine_memory.h"
#include "common/collective_trace.h"
#include "launcher/failure_origin.h"
#include "launcher/process.h"
#include "launcher/root_cause.h"
#include "launcher/round_spec.h"
#include "launcher/worker_env.h"

extern char** environ;

namespace dtrain::launcher {

namespace {

// A port the kernel considers free now (for MASTER_PORT if we host rank 0).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

// Wall-clock seconds since the epoch: goodput compares them with the
// workers' CLOCK_REALTIME stamps.
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string rank_list(const rendezvous::Assignment& a) {
  std::string out;
  for (const auto& r : a.local_ranks) out += (out.empty() ? "" : ",") + std::to_string(r.rank);
  return out;
}

// What makes two checkpoint failures "the same": the error code and the
// step the rank failed in, not the text (ranks word one error differently:
// rank 0 names the files that do not verify, the others say rank 0 does).
// "" for any failure that is not a checkpoint error.
std::string checkpoint_failure_key(const ErrorFileRecord& r) {
  if (r.error_code != error_code_name(ErrorCode::checkpoint)) return "";
  return r.step > 0 ? "in step " + std::to_string(r.step) : "before the first step";
}

}  // namespace

Agent::Agent(const JobSpec& spec, AgentConfig config, rendezvous::RendezvousClient& client)
    : spec_(spec), config_(std::move(config)), client_(client) {}

Agent::~Agent() {
  heartbeat_.reset();
  procs_.reset();  // SIGKILLs and reaps anything left (only on an exception path)
  discard_kept();
  spares_.reset();  // before watch_, which forgets them
  memory_.reset();  // the in-memory copies go with the job
  watch_.reset();  // after procs_: tells the watcher to quit
  relay_.reset();
}

void Agent::finish_goodput() {
  if (!goodput_) return;
  const double now = wall_now();
  goodput_->finish(now);
  std::cerr << goodput_->table(now) << std::flush;
  goodput_.reset();
}

int Agent::run() {
  launched_ = wall_now();
  try {
    for (;;) {
      rendezvous::Assignment a = rendezvous_step();
      if (a.node_rank == 0 && !goodput_)
        goodput_ = std::make_unique<Goodput>(config_.run_dir, launched_, spec_.log.tensorboard);
      round_restart_ = a.restart;
      int restart = std::max(a.restart, failures_);
      check_restarts_left(restart);
      round_gbs_ = write_round_spec(spec_, a, config_.spec_path, round_gbs_);
      start_step(a, restart);
      Outcome outcome = monitor_step();
      if (goodput_) goodput_->ended(wall_now());
      if (outcome == Outcome::succeeded) {
        stop_step(SIGTERM);  // nothing left to stop; joins the heartbeat thread
        if (stop_signal_ != 0) break;
        leave(true);
        finish_goodput();
        return 0;
      }
      // The survivors go on in the next round, same processes; not after a
      // hang: a stopped or stuck worker cannot read its channel or leave
      // its collective, and which rank hangs is a guess: stop them all.
      if (outcome == Outcome::round_changed && in_place() && !round_ended_by_hang())
        keep_step();
      else
        stop_step(stop_signal_for(outcome));
      if (stop_signal_ != 0) break;
      // A worker that stopping showed had failed before the notice: reported as this node's failure.
      if (outcome == Outcome::round_changed && first_failure_) outcome = Outcome::failed;
      if (outcome == Outcome::failed && !first_failure_) outcome = Outcome::round_changed;
      if (outcome == Outcome::failed && round_moved_on()) outcome = Outcome::round_changed;
      if (outcome == Outcome::unreachable) {  // a partition: re-join when the link returns (rejoin.cpp)
        begin_rejoin();
        continue;
      }
      if (outcome == Outcome::round_changed) {
        DTRAIN_WARN("rendezvous: {}; {} this node's workers, re-joining{}", heartbeat_detail_,
                    kept_.empty() ? "stopped" : "kept",
                    remote_failure_.empty() ? "" : "\n  because: " + remote_failure_);
        const rendezvous::ServerStatus status = server_status();
        if (status.stopped)  // another node's worker failed on a config error: re-joining would repeat it
          throw Error(ErrorCode::worker_failed,
                      "the job stopped without a restart: a worker failed on an error that a restart would "
                      "repeat (a configuration error, or the same checkpoint error twice): " + status.failure,
                      "see the root-cause block printed by the node that failed");
        const int used = status.restart;
        if (used > spec_.cluster.max_restarts) print_remote_root_cause(used);
        check_restarts_left(used);  // do not wait for a node that gave up
        continue;
      }
      int code = restart_or_fail(restart);
      if (code >= 0) {
        finish_goodput();
        return code;
      }
    }
  } catch (...) {
    leave(false);
    finish_goodput();
    throw;
  }
  DTRAIN_WARN("received {}: stopped every worker", signal_name(stop_signal_));
  leave(false);
  finish_goodput();
  return 128 + stop_signal_;
}

// SIGKILL at once where SIGTERM cannot help: a node is gone, or the round
// ended on a hang (the ranks wait in a collective that cannot finish, one of
// them perhaps stopped: none reaches its SIGTERM save, and grace_s would be
// lost whole).
int Agent::stop_signal_for(Outcome outcome) const {
  if (outcome == Outcome::signaled) return stop_signal_;
  if (outcome == Outcome::round_changed && heartbeat_ &&
      (heartbeat_->failure().find("declared dead") != std::string::npos || round_ended_by_hang()))
    return SIGKILL;
  return SIGTERM;
}

void Agent::check_restarts_left(int restart) const {
  if (restart <= spec_.cluster.max_restarts) return;
  throw Error(ErrorCode::worker_failed,
              "the job failed on another node and restarts are used up (restart " +
                  std::to_string(restart) + " > cluster.max_restarts " +
                  std::to_string(spec_.cluster.max_restarts) + ")",
              "see the root-cause block printed by the node that failed");
}

// A worker that failed after the rendezvous opened a new round for a
// membership change (a dead node, a node joining; the restart count is
// unchanged) is a consequence of that change: its peers were stopped under
// it. Re-join instead of failing. A round ended by another node's failure
// report is not this: the local failure is then reported as usual.
bool Agent::round_moved_on() {
  rendezvous::ServerStatus status;
  try {
    status = client_.status();
  } catch (const Error&) {
    return false;
  }
  if (status.round == group_.round || status.restart != round_restart_) return false;
  heartbeat_detail_ = "round " + std::to_string(group_.round) + " -> " + std::to_string(status.round) +
                      " (rank " + std::to_string(first_failure_ ? first_failure_->rank : -1) +
                      " failed after the round ended)";
  remote_failure_ = status.failure;
  return true;
}

rendezvous::Assignment Agent::rendezvous_step() {
  rendezvous::JoinInfo info;
  info.job = config_.job;
  info.token = config_.token;
  info.node_id = config_.node_id;
  info.host = config_.host;
  info.hostname = config_.hostname;
  info.slots = spec_.cluster.procs_per_node;
  info.node_rank = config_.node_rank;
  info.gpu = spec_.cluster.device == DeviceKind::cuda;
  info.master_port = free_port();
  rendezvous::Assignment a =
      rejoining_ ? rejoin(info) : client_.join(info, spec_.cluster.rendezvous.join_timeout_s);
  num_nodes_ = a.num_nodes;
  if (a.node_rank == 0)
    for (const auto& w : a.placement.warnings) DTRAIN_WARN("placement: {}", w);
  return a;
}

void Agent::start_step(const rendezvous::Assignment& a, int restart) {
  group_ = WorkerGroup{};
  group_.round = a.round;
  group_.restart = restart;
  group_.node_rank = a.node_rank;
  group_.world = a.world;
  first_failure_.reset();
  notice_at_ = 0;
  relay_ = std::make_unique<SignalRelay>();
  if (!watch_) watch_ = WorkerWatch::start(spec_.cluster.grace_s);
  procs_ = std::make_unique<ProcessGroup>(relay_->fd(), watch_.get());

  WorkerEnvInputs in;
  in.base = current_environment();
  in.assignment = &a;
  in.restart = restart;
  in.max_restarts = spec_.cluster.max_restarts;
  in.job = config_.job;
  in.spec_path = config_.spec_path;
  in.run_dir = config_.run_dir;
  in.cores = usable_cpus();
  in.extra_env = config_.extra_env;
  in.gloo_ifname = config_.ifname;
  in.agent_pid = ::getpid();  // the worker watch's fallback (worker_watch.h)
  if (!memory_ && spec_.checkpoint.memory_on(spec_.cluster.nodes_max)) {
    memory_ = MemoryCopies::create(config_.job, config_.node_id);
    if (memory_ && watch_) watch_->remove_on_death(memory_->dir());
    if (memory_) DTRAIN_INFO("checkpoint.memory: this node keeps its in-memory copies in {}", memory_->dir());
  }
  if (memory_) in.extra_env.push_back("DTRAIN_MEMORY_DIR=" + memory_->dir());
  if (in_place()) {  // the worker waits this long for a round change's notice after its round failed
    const auto& r = spec_.cluster.rendezvous;
    in.extra_env.push_back("DTRAIN_ROUND_CHANNEL=1");
    in.extra_env.push_back("DTRAIN_ROUND_WAIT_S=" + std::to_string(4 * r.heartbeat_s + r.last_call_s + 2));
  }
  const auto& show = config_.console_ranks;
  for (const auto& placement : a.local_ranks) {
    Worker w;
    w.rank = placement.rank;
    w.local_rank = placement.device;
    w.spec.argv = config_.entrypoint;
    w.spec.env = worker_env(in, placement);
    w.spec.log_path = config_.run_dir + "/rank_" + std::to_string(w.rank) + ".log";
    w.spec.error_file = error_file_path(config_.run_dir, w.rank);
    w.spec.console = show.empty() || std::find(show.begin(), show.end(), w.rank) != show.end();
    std::remove(w.spec.error_file.c_str());  // a stale file must not explain this run
    std::remove(trace::trace_path(config_.run_dir, w.rank).c_str());  // nor a stale trace
    // Logs are appended to, never truncated: an earlier run's or restart's
    // output stays above this separator.
    const std::string header = "===== dtrain: " + config_.log_header + ", round " + std::to_string(a.round) +
                               ", restart " + std::to_string(restart) + ", rank " + std::to_string(w.rank) +
                               " =====";
    auto kept = take_kept(group_.workers.size(), w.spec);
    auto spare = !kept && spares_ ? spares_->take(group_.workers.size(), w.spec, in_place()) : nullptr;
    if (kept) {
      w.pid = procs_->adopt(w.rank, w.spec, header, std::move(kept));
      DTRAIN_INFO("rank {} continues in pid {}: recovered in place, the new round's environment sent", w.rank, w.pid);
    } else if (spare) {
      w.pid = procs_->adopt(w.rank, w.spec, header, std::move(spare));
      DTRAIN_INFO("rank {} starts in warm spare pid {} (LibTorch already loaded)", w.rank, w.pid);
    } else {
      w.pid = procs_->spawn(w.rank, w.spec, header, in_place());
    }
    w.state = WorkerState::HEALTHY;
    group_.workers.push_back(std::move(w));
  }
  discard_kept();  // more kept workers than this round's local ranks
  // The job's first spares start with its first workers; later ones wait
  // until this round trains (monitor_step), so that their library load does
  // not compete with a restart's workers (or a joining node's) for the CPUs.
  refill_spares_ = spares_ != nullptr;
  if (!spares_) fill_spares();
  group_.state = WorkerState::HEALTHY;
  SignalRelay* relay = relay_.get();
  // The builtin engine's collective traces of this node's ranks, with each
  // rank's CPU time (a slow rank is told from a stuck one by it).
  std::vector<std::pair<std::string, pid_t>> traces;
  for (const auto& w : group_.workers) traces.emplace_back(trace::trace_path(config_.run_dir, w.rank), w.pid);
  progress_ = [traces] {
    std::vector<trace::RankProgress> out;
    for (const auto& [path, pid] : traces) {
      trace::RankProgress p;
      if (!trace::read_progress(path, &p)) continue;
      p.cpu_ns = pid > 0 ? process_cpu_ns(pid) : 0;
      out.push_back(std::move(p));
    }
    return out;
  };
  if (goodput_) goodput_->started(wall_now());
  heartbeat_ = std::make_unique<Heartbeat>(client_, config_.node_id, a.round,
                                           spec_.cluster.rendezvous.heartbeat_s,
                                           [relay] { relay->wake(); }, progress_);
  DTRAIN_INFO("round {}: node {} of {}, ranks {} of {} (restart {}), master {}:{}", a.round,
              a.node_rank, a.num_nodes, rank_list(a), a.world, restart, a.master_addr,
              a.master_port);
}

// The next restart's processes start now, so that they load LibTorch
// while this round trains (warm_spares.h). Only a job that can restart,
// with the builtin engine (the one that reads its environment from a
// spare's pipe).
void Agent::fill_spares() {
  const auto& c = spec_.cluster;
  if (!c.warm_spares || !spec_.builtin_entrypoint() || (c.max_restarts == 0 && c.nodes_min == c.nodes_max))
    return;
  if (!spares_) spares_ = std::make_unique<WarmSpares>(watch_.get());
  std::vector<WorkerSpec> like;
  for (const auto& w : group_.workers) like.push_back(w.spec);
  spares_->fill(like);
}

// Every local rank finished a step of this round (its collective trace).
bool Agent::round_trains() const {
  const auto progress = progress_();
  if (progress.size() < group_.workers.size()) return false;
  return std::all_of(progress.begin(), progress.end(),
                     [](const trace::RankProgress& p) { return p.done_step > p.start_step; });
}

Agent::Outcome Agent::monitor_step() {
  auto next_goodput = std::chrono::steady_clock::now();
  for (;;) {
    auto events = procs_->poll(0.5);
    if (goodput_ && std::chrono::steady_clock::now() >= next_goodput) {  // goodput.json stays current
      goodput_->observe(wall_now());
      next_goodput = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
    relay_->drain();
    for (const auto& e : events) record_exit(e, /*stopping=*/false);
    if (int sig = relay_->take_stop_signal()) {
      stop_signal_ = sig;
      DTRAIN_WARN("received {}: forwarding it to {} worker(s), SIGKILL after {} s",
                  signal_name(sig), procs_->running(), spec_.cluster.grace_s);
      return Outcome::signaled;
    }
    if (auto outcome = group_outcome()) return *outcome;
    if (refill_spares_ && round_trains()) {
      refill_spares_ = false;
      fill_spares();
    }
    switch (heartbeat_->verdict()) {
      case Heartbeat::Verdict::ok: break;
      case Heartbeat::Verdict::round_changed: return after_round_change_notice();
      case Heartbeat::Verdict::unreachable: return Outcome::unreachable;
    }
  }
}

void Agent::record_exit(const ExitEvent& event, bool stopping) {
  Worker& w = group_.workers[event.index];
  w.exit = event.status;
  w.ended = event.when;
  if (stopping && !event.status.success()) w.error_file_text = read_error_file(w.spec.error_file);
  // Failed before the failure (or the round change notice) that made the
  // agent stop it: by its error file's time, written before it exited.
  const bool failed_first = !event.status.success() && !w.error_file_text.empty() &&
                            ((first_failure_ && failure_time(w) < failure_time(*first_failure_)) ||
                             (notice_at_ > 0 && failure_time(w) < notice_at_));
  if (stopping && !failed_first) {
    w.state = WorkerState::STOPPED;
    // Says whether it ended on its own (exit code) or by SIGKILL after grace_s.
    DTRAIN_INFO("rank {} (local rank {}, pid {}) stopped: {}", w.rank, w.local_rank, w.pid,
                w.exit.describe());
  } else if (stopping) {
    // It had failed before the failure that made the agent stop it (which
    // was that failure's consequence): it is the root cause.
    w.state = WorkerState::FAILED;
    DTRAIN_ERROR("rank {} (local rank {}, pid {}) had failed first: {}", w.rank, w.local_rank,
                 w.pid, w.exit.describe());
    if (!first_failure_ || failure_time(w) < failure_time(*first_failure_)) first_failure_ = w;
  } else if (event.status.success()) {
    w.state = WorkerState::SUCCEEDED;
  } else {
    w.state = WorkerState::FAILED;
    w.error_file_text = read_error_file(w.spec.error_file);
    DTRAIN_ERROR("rank {} (local rank {}, pid {}) failed: {}", w.rank, w.local_rank, w.pid,
                 w.exit.describe());
    if (!first_failure_ || failure_time(w) < failure_time(*first_failure_)) first_failure_ = w;
  }
}

std::optional<Agent::Outcome> Agent::group_outcome() const {
  bool all_succeeded = true;
  for (const auto& w : group_.workers) {
    if (w.state == WorkerState::FAILED) return Outcome::failed;
    all_succeeded = all_succeeded && w.state == WorkerState::SUCCEEDED;
  }
  if (all_succeeded) return Outcome::succeeded;
  return std::nullopt;
}

void Agent::stop_step(int first_signal) {
  const bool now = first_signal == SIGKILL;
  if (procs_ && procs_->running() > 0 && now)
    DTRAIN_INFO("stopping {} worker(s) with SIGKILL now: {}, so their collectives cannot finish (nor a "
                "save on SIGTERM)", procs_->running(),
                round_ended_by_hang() ? "the round ended on a hang" : "a node is gone");
  else if (procs_ && procs_->running() > 0)
    DTRAIN_INFO("stopping {} worker(s): {}, SIGKILL after {} s", procs_->running(),
                signal_name(first_signal), spec_.cluster.grace_s);
  if (procs_) {
    auto events = procs_->close(first_signal, now ? 0.0 : spec_.cluster.grace_s, [this] { return hurry(); });
    for (const auto& e : events) record_exit(e, /*stopping=*/true);
  }
  end_round_handles();
  group_.state = first_failure_ ? WorkerState::FAILED
                 : std::all_of(group_.workers.begin(), group_.workers.end(),
                               [](const Worker& w) { return w.state == WorkerState::SUCCEEDED; })
                     ? WorkerState::SUCCEEDED
                     : WorkerState::STOPPED;
}

bool Agent::hurry() {
  relay_->drain();
  int sig = relay_->take_stop_signal();
  if (sig == 0) return false;
  if (stop_signal_ != 0) return true;  // a second signal: SIGKILL now
  stop_signal_ = sig;                  // stopping for a failure: do not restart after it
  return false;
}

int Agent::restart_or_fail(int restart) {
  const Worker& first = *first_failure_;
  // A config error (bad input: a data file changed under the run, a
  // diverged run) fails the same way on every restart: not retried here,
  // and reported permanent so that no other node re-joins for it.
  const ErrorFileRecord record = parse_error_file(first.error_file_text);
  const bool config_error = record.error_code == error_code_name(ErrorCode::config);
  // So does a checkpoint error that the previous attempt failed on at the
  // same point (no checkpoint that any fallback accepts, a checkpoint.dir
  // that cannot be written): that restart made no progress.
  const std::string key = checkpoint_failure_key(record);
  const bool repeated = !key.empty() && key == last_checkpoint_failure_;
  last_checkpoint_failure_ = key;
  report_failure(first, config_error || repeated);
  if (config_error && restart < spec_.cluster.max_restarts)
    DTRAIN_WARN("not restarting: rank {} stopped on a configuration error, which a restart would repeat",
                first.rank);
  if (repeated && restart < spec_.cluster.max_restarts)
    DTRAIN_WARN("not restarting: rank {} failed {} on the same checkpoint error as the previous attempt; "
                "retrying cannot help: {}", first.rank, key, record.message.substr(0, record.message.find('\n')));
  if (!config_error && !repeated && restart < spec_.cluster.max_restarts) {
    failures_ = restart + 1;
    DTRAIN_WARN("restarting the workers: restart {} of {} (rank {} failed: {})", failures_,
                spec_.cluster.max_restarts, first.rank, first.exit.describe());
    return -1;
  }
  RootCause cause;
  cause.host = config_.hostname;
  cause.addr = config_.host;
  cause.node_id = config_.node_id;
  cause.node_rank = group_.node_rank;
  cause.restarts_used = restart;
  cause.max_restarts = spec_.cluster.max_restarts;
  cause.worker = first;
  // Another node's failure may have come first (and broken this node's
  // collectives): the rendezvous keeps the earliest, and every node prints it.
  const std::string earlier = settled_failure();
  if (!earlier.empty() && !failure_is_ours(earlier, config_.node_id, first.rank)) {
    print_remote_root_cause(restart + 1, earlier);
    DTRAIN_ERROR("this node's rank {} failed after it: {}", first.rank, first.exit.describe());
  } else {
    std::cerr << cause.to_text() << std::flush;
  }
  leave(false);
  int code = first.exit.shell_code();
  return code != 0 ? code : 1;
}

void Agent::print_remote_root_cause(int restart) const {
  const std::string settled = settled_failure();
  print_remote_root_cause(restart, settled.empty() ? remote_failure_ : settled);
}

void Agent::print_remote_root_cause(int restart, const std::string& failure) const {
  const std::string rule(72, '=');
  std::string text = failure.empty() ? "the job failed on another node" : failure;
  std::string indented;
  size_t from = 0;
  while (from <= text.size()) {
    size_t nl = text.find('\n', from);
    indented += "    " + text.substr(from, nl == std::string::npos ? std::string::npos : nl - from) + "\n";
    if (nl == std::string::npos) break;
    from = nl + 1;
  }
  std::cerr << rule << "\n"
            << "dtrain: job failed. Root cause (as the rendezvous tells every node):\n"
            << indented
            << "  this node  : " << group_.node_rank << " (" << config_.node_id << ", "
            << config_.hostname << ")\n"
            << "  restarts   : " << restart << " > cluster.max_restarts "
            << spec_.cluster.max_restarts << "\n"
            << rule << "\n"
            << std::flush;
}

void Agent::leave(bool success) {
  try {
    client_.leave(config_.node_id, success);
  } catch (const Error& e) {
    DTRAIN_DEBUG("leave: {}", e.message());
  }
}

}  // namespace dtrain::launcher
