// Conversions between the generated protobuf messages and the plain types of
// rendezvous_types.h. Internal to dtrain_rendezvous (includes generated code):
// never include it from a public header.
#pragma once

#include "rendezvous/rendezvous.pb.h"
#include "rendezvous/rendezvous_types.h"
#include "rendezvous/round_state.h"

namespace dtrain::rendezvous::detail {

void to_proto(const JoinInfo& info, double timeout_s, pb::JoinRequest* out);
JoinInfo from_proto(const pb::JoinRequest& req);

// Lookups over one round's placement, built once per round, so that each
// node's part is cut out in O(its ranks + its groups), not O(world).
struct PlacementIndex {
  explicit PlacementIndex(const Placement& placement);
  std::vector<std::vector<int>> ranks_of_node;   // global ranks, ascending
  std::vector<std::vector<int>> groups_of_rank;  // indices into placement.groups
  std::vector<int> stride_of_group;              // step between its ranks, 0 = uneven
};

// The whole placement as a serialized PlacementInfo (Status, `topo`).
std::string placement_bytes(const Placement& placement);
// Node `node`'s part: its ranks, the groups they are in, every warning.
std::string node_placement_bytes(const Placement& placement, const PlacementIndex& index, int node);
void to_proto(const ClosedRound& closed, int node_rank, const std::string& placement_bytes,
              pb::JoinReply* out);
Assignment from_proto(const pb::JoinReply& reply);
// Either kind of PlacementInfo back into a Placement (mesh left as given).
// Throws Error(rendezvous) when malformed.
void parse_placement(const std::string& bytes, Placement* out);
// Fills out->placement and out->local_ranks (by out->node_rank).
void parse_placement(const std::string& bytes, Assignment* out);

void to_proto(const trace::RankProgress& p, pb::RankProgressInfo* out);
trace::RankProgress from_proto(const pb::RankProgressInfo& p);

void to_proto(const FailureReport& report, pb::FailureRequest* out);
FailureReport from_proto(const pb::FailureRequest& req);

void to_proto(const ServerStatus& status, pb::StatusReply* out);
ServerStatus from_proto(const pb::StatusReply& reply);

}  // namespace dtrain::rendezvous::detail
