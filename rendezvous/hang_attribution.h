// Hang attribution: from every rank's collective progress (common/
// collective_trace.h, reported with the agents' heartbeats), which rank(s)
// never entered the collective the others wait in, and what those ranks did
// last. Pure (no clock, no gRPC): the round state decides when to ask.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/collective_trace.h"
#include "rendezvous/topology.h"

namespace dtrain::rendezvous {

struct RankWhere {
  int node = -1;
  std::string host, hostname;  // address and name of its node
};

struct HangReport {
  bool waiting = false;        // some rank waits in a collective
  std::string group, op;       // the collective most ranks wait in
  uint64_t seq = 0;
  std::vector<int> waiting_ranks, missing_ranks;  // missing: never entered it
  std::string text;            // the human report (several lines)
};

// mesh: the round's; ranks: by global rank (ranks not reported are unknown).
HangReport attribute_hang(const mesh::Mesh& mesh, const std::map<int, trace::RankProgress>& ranks,
                          const std::map<int, RankWhere>& where, double stalled_s,
                          double hang_timeout_s, const std::string& bound_name = "cluster.hang_timeout_s");

// The global ranks of the group named `group` ("world", "control", a mesh
// axis) that holds `rank`.
std::vector<int> group_members(const mesh::Mesh& mesh, const std::string& group, int rank);

}  // namespace dtrain::rendezvous
