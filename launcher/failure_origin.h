// Which failure is the job's root cause when several nodes fail at once: a
// worker that dies breaks its peers' collectives, so their nodes fail too,
// a moment later. The rendezvous keeps the first report of a round (its
// `failure` text, rendezvous/round_state.cpp); a node whose own failure came
// later prints that one. Pure string logic; asks nobody.
#pragma once

#include <string>

namespace dtrain::launcher {

// True when `failure` (the rendezvous' text) is the report of `rank` on the
// node `node_id`: "rank R (local rank L) on node ... 'NODE_ID' ...".
bool failure_is_ours(const std::string& failure, const std::string& node_id, int rank);

}  // namespace dtrain::launcher
