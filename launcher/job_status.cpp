// job_status.h. Every failure is one dtrain::Error line with no hint: the
// CLI prints "dtrain: error: <line>" and nothing else (no gRPC detail, and
// never the token).
#include "launcher/job_status.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "launcher/run_dir_lock.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/token.h"

namespace dtrain::launcher {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The rank's state: done, waiting in a collective, or its phase.
std::string rank_state(const trace::RankProgress& p) {
  if (p.waiting) return "waiting";
  return p.phase.empty() ? "unknown" : p.phase;
}

std::string last_collective(const trace::RankProgress& p) {
  if (!p.has_done) return "-";
  return p.last_done.group + "." + p.last_done.op + "#" + std::to_string(p.last_done.seq);
}

}  // namespace

StatusTarget find_status_target(const std::string& rdzv, const std::string& log_dir) {
  StatusTarget t;
  const char* env = std::getenv("DTRAIN_TOKEN");
  if (env && *env) t.token = rendezvous::read_token("", false);
  if (!rdzv.empty()) {
    t.endpoint = rdzv;
    if (t.token.empty())
      throw Error(ErrorCode::config, "dtrain status --rdzv " + rdzv + " needs the job's token in DTRAIN_TOKEN");
    return t;
  }
  const std::string dir = fs::absolute(log_dir).lexically_normal().string();
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::config, "dtrain status: " + log_dir + " is not a directory (give a job's log.dir)");
  const LockOwner owner = LockOwner::from_text(read_text(dir + "/" + kLockFile));
  t.endpoint = owner.endpoint;
  if (t.endpoint.empty())
    throw Error(ErrorCode::rendezvous, "no running job in " + dir + ": its lock file " + kLockFile +
                                           " names no rendezvous (the job has finished, or never started)");
  if (t.token.empty()) {
    const std::string token_file = dir + "/" + kTokenFile;
    if (!fs::exists(token_file))
      throw Error(ErrorCode::config, "job '" + owner.job + "' in " + dir + " (rendezvous " + t.endpoint +
                                         ") has no token file: set DTRAIN_TOKEN to the job's token");
    t.token = rendezvous::read_token(token_file, false);
  }
  return t;
}

rendezvous::ServerStatus query_status(const StatusTarget& target) {
  rendezvous::ClientOptions o;
  o.endpoint = target.endpoint;
  o.token = target.token;
  o.call_timeout_s = 5;
  try {
    rendezvous::RendezvousClient client(o);
    return client.status();
  } catch (const Error& e) {
    const std::string& m = e.message();
    if (m.find("wrong token") != std::string::npos || m.find("TLS handshake") != std::string::npos)
      throw Error(ErrorCode::rendezvous, "the rendezvous at " + target.endpoint +
                                             " refused the token: it is not this job's token (DTRAIN_TOKEN)");
    if (m.find("cannot reach") != std::string::npos || e.code() == ErrorCode::timeout)
      throw Error(ErrorCode::rendezvous,
                  "no job answers at " + target.endpoint + ": it has finished, or that address is not reachable");
    throw Error(ErrorCode::rendezvous, m.substr(0, m.find('\n')));
  }
}

std::string status_text(const rendezvous::ServerStatus& s, const std::string& endpoint) {
  std::string out = fmt::format("job '{}' at {}: round {}{}, restarts {}, {} node(s){}\n", s.job, endpoint, s.round,
                                s.round_open ? " (forming)" : "", s.restart, s.nodes.size(),
                                s.failure.empty() ? "" : "; last failure: " + s.failure.substr(0, s.failure.find('\n')));
  out += fmt::format("{:<6} {:<6} {:<22} {:<10} {:>8} {:>11} {:>10} {:<22} {:>9}\n", "node", "rank", "address",
                     "state", "step", "tokens/s", "loss", "last collective", "straggler");
  for (const auto& n : s.nodes) {
    out += fmt::format("{:<6} {:<6} {:<22} {:<10} heartbeat {:.1f} s ago ({})\n", n.node_rank, "-", n.host,
                       n.ranks.empty() ? "starting" : "running", n.last_heartbeat_age_s, n.hostname);
    for (const auto& p : n.ranks)
      out += fmt::format("{:<6} {:<6} {:<22} {:<10} {:>8} {:>11.0f} {:>10} {:<22} {:>9}\n", n.node_rank, p.rank,
                         "", rank_state(p), p.done_step, p.tokens_per_s(),
                         p.has_loss ? fmt::format("{:.4f}", p.loss) : "-", last_collective(p),
                         p.straggler_ratio > 0 ? fmt::format("{:.2f}", p.straggler_ratio) : "-");
  }
  return out;
}

std::string status_json(const rendezvous::ServerStatus& s, const std::string& endpoint) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : s.nodes) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& p : n.ranks) {
      nlohmann::json r = {{"rank", p.rank},           {"state", rank_state(p)},
                          {"step", p.done_step},      {"tokens_per_s", p.tokens_per_s()},
                          {"last_collective", last_collective(p)},
                          {"straggler_ratio", p.straggler_ratio}};
      r["loss"] = p.has_loss && std::isfinite(p.loss) ? nlohmann::json(p.loss) : nlohmann::json(nullptr);
      ranks.push_back(r);
    }
    nodes.push_back({{"id", n.node_id},
                     {"node_rank", n.node_rank},
                     {"address", n.host},
                     {"hostname", n.hostname},
                     {"heartbeat_age_s", n.last_heartbeat_age_s},
                     {"ranks", ranks}});
  }
  nlohmann::json j = {{"job", s.job},         {"endpoint", endpoint},       {"round", s.round},
                      {"restarts", s.restart}, {"forming", s.round_open},   {"failure", s.failure},
                      {"stopped", s.stopped},  {"nodes", nodes}};
  return j.dump(1) + "\n";
}

}  // namespace dtrain::launcher
