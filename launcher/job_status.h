// `dtrain status`: a running job's state, asked of its rendezvous (the
// agents' heartbeats carry each rank's step, loss, tokens/s and last
// collective). Owns finding the job (--rdzv, or a log.dir's lock and token
// files), the one query and its two renderings; not the CLI wiring.
#pragma once

#include <string>

#include "rendezvous/rendezvous_types.h"

namespace dtrain::launcher {

struct StatusTarget {
  std::string endpoint;  // HOST:PORT
  std::string token;
};

// From --rdzv (token from DTRAIN_TOKEN) or a LOG_DIR: the endpoint its lock
// file records, the token from DTRAIN_TOKEN or the job's 0600 token file.
// Throws a one-line Error(rendezvous) when no running job is recorded there.
StatusTarget find_status_target(const std::string& rdzv, const std::string& log_dir);

// One Status call. Failures are one line without the token: a finished or
// unreachable job, a wrong token.
rendezvous::ServerStatus query_status(const StatusTarget& target);

// One line per node and per rank: state, step, tokens/s, loss, last
// completed collective, straggler ratio; the round and restarts on top.
std::string status_text(const rendezvous::ServerStatus& s, const std::string& endpoint);
// {"job", "endpoint", "round", "restarts", ..., "nodes": [{"id", "address",
// "hostname", "ranks": [{"rank", "step", ...}]}]}
std::string status_json(const rendezvous::ServerStatus& s, const std::string& endpoint);

}  // namespace dtrain::launcher
