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

void to_proto(const ClosedRound& closed, int node_rank, pb::JoinReply* out);
Assignment from_proto(const pb::JoinReply& reply);

void to_proto(const FailureReport& report, pb::FailureRequest* out);
FailureReport from_proto(const pb::FailureRequest& req);

void to_proto(const ServerStatus& status, pb::StatusReply* out);
ServerStatus from_proto(const pb::StatusReply& reply);

}  // namespace dtrain::rendezvous::detail
