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

// The round's placement as a serialized PlacementInfo: built once per round.
std::string placement_bytes(const Placement& placement);
void to_proto(const ClosedRound& closed, int node_rank, const std::string& placement_bytes,
              pb::JoinReply* out);
Assignment from_proto(const pb::JoinReply& reply);
// Fills out->placement and out->local_ranks (by out->node_rank) from
// placement_bytes' output. Throws Error(rendezvous) when malformed.
void parse_placement(const std::string& bytes, Assignment* out);

void to_proto(const FailureReport& report, pb::FailureRequest* out);
FailureReport from_proto(const pb::FailureRequest& req);

void to_proto(const ServerStatus& status, pb::StatusReply* out);
ServerStatus from_proto(const pb::StatusReply& reply);

}  // namespace dtrain::rendezvous::detail
