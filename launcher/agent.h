// The node agent (torch.distributed.elastic's model, as named steps):
// rendezvous -> start -> monitor -> stop -> restart, until the job succeeds,
// restarts run out, a signal arrives or the rendezvous is lost. Owns this
// node's WorkerGroup; the rendezvous server and the CLI live elsewhere.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "launcher/goodput.h"
#include "launcher/heartbeat.h"
#include "launcher/memory_copies.h"
#include "launcher/process_group.h"
#include "launcher/signal_relay.h"
#include "launcher/warm_spares.h"
#include "launcher/worker.h"
#include "rendezvous/rendezvous_client.h"

namespace dtrain::launcher {

struct AgentConfig {
  std::vector<std::string> entrypoint;  // resolved argv of every worker
  std::string job;
  std::string token;
  std::string node_id;                  // unique per agent (address:pid)
  std::string host;                     // address other nodes reach this one at (numeric)
  std::string ifname;                   // the interface holding `host`
  std::string hostname;                 // this machine's name, for the root cause
  std::string endpoint;                 // the rendezvous, for messages
  int node_rank = -1;                   // requested node rank, -1 = any
  std::vector<int> console_ranks;       // empty = all
  std::vector<std::string> extra_env;
  std::string run_dir;                  // absolute log.dir
  std::string spec_path;                // <run_dir>/spec.resolved.yaml
  std::string log_header;               // names this run in the rank logs' separator lines
};

class Agent {
 public:
  Agent(const JobSpec& spec, AgentConfig config, rendezvous::RendezvousClient& client);
  ~Agent();

  // Returns the job's exit code on this node: 0, the first failure's code
  // (128 + signal when a worker was killed), or 128 + the signal dtrain got.
  // Throws dtrain::Error on refusals, join timeouts and a lost rendezvous.
  int run();

  // Nodes in the last round (1 until the first round closed).
  int num_nodes() const { return num_nodes_; }

 private:
  enum class Outcome { succeeded, failed, round_changed, unreachable, signaled };

  rendezvous::Assignment rendezvous_step();
  void start_step(const rendezvous::Assignment& assignment, int restart);
  Outcome monitor_step();
  // After a remote round change: this node's own workers are reaped first,
  // and one that failed before the notice makes the round `failed` (it is
  // reported, so the rendezvous can name it the root cause). agent_failure.cpp.
  Outcome after_round_change_notice();
  void fill_spares();  // warm spares for the next restart (warm_spares.h)
  bool round_trains() const;  // every local rank finished a step of this round
  void stop_step(int first_signal);
  // Recovery in place (agent_in_place.cpp): on a round change keep_step
  // takes the live workers out of the round's group instead of stopping
  // them; the next start_step hands each its new environment (take_kept).
  bool in_place() const;
  bool round_ended_by_hang() const;  // the rendezvous named a hang as this round's end
  void keep_step();
  std::unique_ptr<Process> take_kept(size_t slot, const WorkerSpec& spec);
  void discard_kept();  // what no slot took: SIGKILLed and reaped
  void end_round_handles();  // after stop or keep: the heartbeat's last words, relay and group state
  // SIGTERM (the workers save on it), or SIGKILL at once when the round
  // ended because a node was declared dead: the workers wait in a collective
  // with a rank that is gone (Gloo cannot abort it) and could not save.
  int stop_signal_for(Outcome outcome) const;
  int restart_or_fail(int restart);  // after a local failure: -1 = restart
  void check_restarts_left(int restart) const;  // throws when restart > max_restarts
  rendezvous::ServerStatus server_status();     // restart 0 and not stopped when unknown
  bool round_moved_on();  // after a local failure: the server is past this round
  // After the rendezvous was lost (rejoin.cpp): begin_rejoin logs and starts
  // the clock (throws when rejoin_timeout_s is 0); rejoin joins until the
  // server admits this node or the time is up (throws).
  void begin_rejoin();
  rendezvous::Assignment rejoin(const rendezvous::JoinInfo& info);
  bool server_answers();  // a status call succeeds

  void record_exit(const ExitEvent& event, bool stopping);
  std::optional<Outcome> group_outcome() const;
  void report_failure(const Worker& worker, bool permanent);  // permanent: a restart would repeat it
  void leave(bool success);
  bool hurry();  // during stop: a (second) signal arrived
  // Restarts used up after another node's (or a hang's) failure: the root
  // cause the rendezvous gave, printed on this node too.
  void print_remote_root_cause(int restart) const;
  void print_remote_root_cause(int restart, const std::string& failure) const;
  // The rendezvous' root cause of the round, after a short settling pause.
  std::string settled_failure() const;

  // Node 0 keeps goodput.json and prints its table when the launch ends.
  void finish_goodput();

  const JobSpec& spec_;
  AgentConfig config_;
  double launched_ = 0;               // when run() began (seconds since the epoch)
  std::unique_ptr<Goodput> goodput_;  // node 0 only (from its first round)
  rendezvous::RendezvousClient& client_;
  std::unique_ptr<SignalRelay> relay_;
  std::unique_ptr<WorkerWatch> watch_;  // stops the workers if this agent dies; outlives procs_
  std::unique_ptr<ProcessGroup> procs_;
  std::unique_ptr<WarmSpares> spares_;  // idle workers a restart takes (warm_spares.h)
  std::vector<std::unique_ptr<Process>> kept_;  // by local rank: workers kept for the next round
  bool refill_spares_ = false;          // refill them once this round trains
  Heartbeat::Progress progress_;        // this node's ranks' collective traces
  std::unique_ptr<MemoryCopies> memory_;  // checkpoint.memory: from the first start to the end
  std::unique_ptr<Heartbeat> heartbeat_;
  WorkerGroup group_;
  std::optional<Worker> first_failure_;  // of the current round
  double notice_at_ = 0;                 // wall time the heartbeat's round change was seen (0 = none)
  int failures_ = 0;                     // restarts this agent asked for
  std::string last_checkpoint_failure_;  // the last failure's checkpoint_failure_key ("": not one)
  int stop_signal_ = 0;                  // SIGINT/SIGTERM dtrain received
  int num_nodes_ = 1;
  int round_gbs_ = 0;                    // global batch of the last round (0 = none yet)
  int round_restart_ = 0;                // the server's restart count when this round closed
  std::string heartbeat_detail_;         // why the heartbeat ended the round
  std::string remote_failure_;           // the rendezvous' reason for ending it
  bool rejoining_ = false;               // lost the rendezvous; the next join retries
  std::chrono::steady_clock::time_point rejoin_since_;
  std::string rejoin_lost_;              // how it was lost, for the give-up message
};

}  // namespace dtrain::launcher
