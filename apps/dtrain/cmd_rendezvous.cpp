// `dtrain rendezvous SPEC --port P`: the standalone rendezvous server for a
// multi-node job (agents then run `dtrain launch SPEC --rdzv HOST:P`). Only CLI
// wiring and signal waiting: the server is rendezvous::RendezvousServer.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "plan/model_size.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/tls.h"
#include "rendezvous/token.h"

namespace dtrain::app {
namespace {

struct RendezvousCmdOptions {
  std::string spec;
  std::vector<std::string> sets;
  std::string host;  // "" = the host of cluster.rendezvous.endpoint
  int port = -1;     // -1 = the port of cluster.rendezvous.endpoint
  bool allow_slow = false;
};

int endpoint_port(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  try {
    if (colon != std::string::npos) return std::stoi(endpoint.substr(colon + 1));
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::config,
              "cluster.rendezvous.endpoint = '" + endpoint + "' has no port",
              "write it as HOST:PORT, or give --port");
}

std::string endpoint_host(const std::string& endpoint) {
  return endpoint.substr(0, endpoint.rfind(':'));
}

// One line on which certificate the server presents (its SHA-256), so an
// operator can compare it with what an agent's handshake error reports.
std::string tls_summary(const rendezvous::ServerOptions& o, const JobSpec& spec) {
  if (o.tls.derived())
    return "TLS: certificate derived from the job's token (sha256 " +
           rendezvous::certificate_fingerprint(rendezvous::token_tls_identity(o.token).cert) + ")";
  return "TLS: " + spec.cluster.rendezvous.tls_cert + " (sha256 " +
         rendezvous::certificate_fingerprint(o.tls.cert) + "), clients checked against " +
         spec.cluster.rendezvous.tls_ca;
}

void run_rendezvous(const RendezvousCmdOptions& o) {
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(o.spec, o.sets, &warnings);
  plan::check_model_size(spec);  // the placement weighs groups by the model's bytes
  for (const auto& w : warnings) std::cerr << "dtrain: warning: " << w << "\n";
  std::string token = rendezvous::read_token(spec.cluster.rendezvous.token_file);
  int port = o.port >= 0 ? o.port : endpoint_port(spec.cluster.rendezvous.endpoint);

  // Block SIGINT/SIGTERM before gRPC starts its threads (they inherit the
  // mask), then wait for one here: a clean shutdown, exit 0.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The address the agents are told, not every interface: what is not
  // meant to be reachable is not.
  const std::string host = o.host.empty() ? endpoint_host(spec.cluster.rendezvous.endpoint) : o.host;
  rendezvous::ServerOptions server_options =
      rendezvous::server_options_from_spec(spec, token, o.allow_slow);
  const std::string tls = tls_summary(server_options, spec);
  rendezvous::RendezvousServer server(std::move(server_options));
  int bound = server.start(host + ":" + std::to_string(port));
  // One flush for both lines: whoever waits for "listening" reads the TLS line too.
  std::cout << "rendezvous listening on " << host << ":" << bound << "\n" << tls << std::endl;
  std::cout << "job '" << spec.job.name << "', nodes "
            << (spec.cluster.nodes_min == spec.cluster.nodes_max
                    ? std::to_string(spec.cluster.nodes_max)
                    : std::to_string(spec.cluster.nodes_min) + ":" +
                          std::to_string(spec.cluster.nodes_max))
            << ", world " << spec.world() << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cout << "rendezvous: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down"
            << std::endl;
  server.shutdown();
}

void add_rendezvous(CLI::App& app, int& /*exit_code*/) {
  auto opts = std::make_shared<RendezvousCmdOptions>();
  CLI::App* cmd = app.add_subcommand(
      "rendezvous", "Run the standalone rendezvous server of a multi-node job until SIGINT/SIGTERM");
  cmd->add_option("spec", opts->spec, "Job spec (YAML)")->required();
  cmd->add_option("--port", opts->port,
                  "Port to listen on (0 = any free port; default: cluster.rendezvous.endpoint's)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", opts->host,
                  "Address to listen on (default: cluster.rendezvous.endpoint's host; 0.0.0.0 = "
                  "every interface)");
  cmd->add_option("--set", opts->sets, "Override a spec field: key.path=value (value read as YAML)");
  cmd->add_flag("--allow-slow", opts->allow_slow,
                "Place a TP group across NVLink islands (warning instead of refusal)");
  cmd->callback([opts] { run_rendezvous(*opts); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(40, add_rendezvous);

}  // namespace dtrain::app
