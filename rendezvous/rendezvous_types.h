// Plain data exchanged by the rendezvous server and client (no gRPC types
// here, so the launcher's headers stay free of generated code).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/collective_trace.h"
#include "rendezvous/topology.h"

namespace dtrain::rendezvous {

// What an agent tells the server when it joins.
struct JoinInfo {
  std::string job;        // job.name; must match the server's
  std::string token;      // shared secret (DTRAIN_TOKEN or token file)
  std::string node_id;    // unique per agent (host:pid by default); duplicates refused
  std::string host;       // address other nodes reach this one at (numeric)
  std::string hostname;   // the machine's name, for logs only (may be shared or unresolvable)
  int slots = 1;          // workers this node runs (procs_per_node)
  int node_rank = -1;     // requested node rank (--node-rank / SLURM), -1 = any
  bool gpu = false;
  std::vector<int> island_of_device;  // NVLink island per local device, may be empty
  int master_port = 0;    // a free port on this host, used if it hosts rank 0
};

// The server's answer when a round closes.
struct Assignment {
  uint64_t round = 0;       // rendezvous round (increments on every new round)
  int restart = 0;          // failure restarts so far (DTRAIN_RESTART)
  int node_rank = 0;        // this agent's node index in the round (GROUP_RANK)
  int num_nodes = 1;
  mesh::Mesh mesh;
  int world = 1;
  std::vector<RankPlacement> local_ranks;  // this node's ranks, by local device
  // This node's part of the placement: its ranks, the groups they are in, and
  // every warning (RendezvousClient::status(true) has the whole placement).
  Placement placement;
  std::string master_addr;
  int master_port = 0;
};

struct HeartbeatReply {
  bool known = true;         // false: the server dropped this node (re-join)
  uint64_t current_round = 0;  // differs from ours: stop workers and re-join
  std::string failure;         // why the last round ended in failure (a hang report, a
                               // worker failure), for every node's root-cause block; "" = none
};

struct FailureReport {
  std::string node_id;
  uint64_t round = 0;
  int rank = -1;
  int local_rank = -1;
  int exit_code = 0;   // valid when signal == 0
  int signal = 0;
  std::string message;
  double failed_at = 0;  // seconds since the epoch; 0 = unknown
  bool permanent = false;  // a restart would repeat it (a worker's config error): the job stops
};

struct NodeStatus {
  std::string node_id;
  std::string host;
  int node_rank = -1;
  double last_heartbeat_age_s = 0;
  std::string hostname;
  std::vector<trace::RankProgress> ranks;  // its ranks' progress, by rank (closed round)
};

struct ServerStatus {
  std::string job;
  uint64_t round = 0;
  int restart = 0;
  int min_nodes = 1, max_nodes = 1;
  bool round_open = true;      // waiting for joiners
  std::vector<NodeStatus> nodes;  // members of the current round (or waiting)
  std::string failure;            // as in HeartbeatReply
  bool stopped = false;           // a permanent failure was reported: agents stop instead of re-joining
  bool has_placement = false;     // asked for and a round has closed
  Placement placement;            // the last closed round's whole placement (same as dtrain topo)
  int waiting_heartbeats = 0;     // heartbeats held until the round moves on (agents listening)
};

}  // namespace dtrain::rendezvous
