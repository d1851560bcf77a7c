// launch(): `dtrain launch` as a library call. Resolves the entrypoint, the
// run directory and the rendezvous (embedded server on one machine / node 0,
// else a client of --rdzv), then runs the Agent. Exit-code rules: launch.h.
#include "launcher/launch.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "launcher/agent.h"
#include "launcher/gpus.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/token.h"

namespace dtrain::launcher {

namespace fs = std::filesystem;

namespace {

std::pair<std::string, int> split_endpoint(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  std::string port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
  if (colon == std::string::npos || port.empty() ||
      port.find_first_not_of("0123456789") != std::string::npos)
    throw Error(ErrorCode::config, "rendezvous endpoint '" + endpoint + "' is not HOST:PORT",
                "e.g. --rdzv node0:29400 or cluster.rendezvous.endpoint: node0:29400");
  return {endpoint.substr(0, colon), std::stoi(port)};
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]";
}

// True when a plain listener (no SO_REUSEPORT) cannot take the port: some
// server (a standalone `dtrain rendezvous`) already listens there.
bool port_taken(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0;
  ::close(fd);
  return taken;
}

std::string hostname() {
  if (const char* h = std::getenv("DTRAIN_HOST"); h && *h) return h;
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf) != 0) return "localhost";
  return buf;
}

std::vector<std::string> resolve_entrypoint(const JobSpec& spec) {
  if (!spec.builtin_entrypoint()) return spec.entrypoint;
  std::string worker = self_dir() + "/dtrain-worker";
  if (::access(worker.c_str(), X_OK) != 0)
    throw Error(ErrorCode::config,
                "entrypoint: builtin needs the LibTorch engine, but " + worker + " does not exist",
                "build it (cmake -DDTRAIN_BUILD_ENGINE=ON, target dtrain-worker), or give a "
                "command: --set 'entrypoint=[python3, train.py]'");
  return {worker};
}

// Create log.dir and write the resolved spec (DTRAIN_SPEC) atomically: two
// agents on one machine may share the directory.
std::pair<std::string, std::string> prepare_run_dir(const JobSpec& spec) {
  std::error_code ec;
  fs::path dir = fs::absolute(spec.log.dir, ec).lexically_normal();
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::config, "log.dir = " + spec.log.dir + ": cannot create " + dir.string(),
                "choose a writable directory");
  std::string run_dir = dir.string();
  if (run_dir.size() > 1 && run_dir.back() == '/') run_dir.pop_back();
  std::string spec_path = run_dir + "/spec.resolved.yaml";
  std::string tmp = spec_path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << job_spec_to_yaml(spec);
  }
  fs::rename(tmp, spec_path, ec);
  if (ec) throw Error(ErrorCode::config, "cannot write " + spec_path + ": " + ec.message());
  return {run_dir, spec_path};
}

// Node 0 of a multi-node job keeps its embedded server up until the other
// nodes have left (or been declared dead), so they are not cut off mid-run.
void wait_for_other_nodes(rendezvous::RendezvousClient& client, const std::string& node_id) {
  bool logged = false;
  for (;;) {
    rendezvous::ServerStatus status;
    try {
      status = client.status();
    } catch (const Error&) {
      return;
    }
    size_t others = std::count_if(status.nodes.begin(), status.nodes.end(),
                                  [&](const auto& n) { return n.node_id != node_id; });
    if (others == 0) return;
    if (!logged) DTRAIN_INFO("keeping the rendezvous up until {} other node(s) finish", others);
    logged = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

std::string self_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return exe.parent_path().string();
}

int launch(const JobSpec& spec, const LaunchOptions& options) {
  check_devices(spec);  // before anything starts
  AgentConfig config;
  config.entrypoint = resolve_entrypoint(spec);
  std::tie(config.run_dir, config.spec_path) = prepare_run_dir(spec);
  config.job = spec.job.name;
  config.console_ranks = options.console_ranks;
  config.extra_env = options.extra_env;
  config.node_rank = options.node_rank;

  const bool one_machine = spec.cluster.nodes_max == 1 && options.rdzv.empty();
  config.token = rendezvous::read_token(spec.cluster.rendezvous.token_file, !one_machine);
  if (config.token.empty()) config.token = rendezvous::random_token();

  std::unique_ptr<rendezvous::RendezvousServer> server;
  if (one_machine) {
    server = std::make_unique<rendezvous::RendezvousServer>(
        rendezvous::server_options_from_spec(spec, config.token, options.allow_slow));
    config.endpoint = "127.0.0.1:" + std::to_string(server->start("127.0.0.1:0"));
  } else {
    config.endpoint = options.rdzv.empty() ? spec.cluster.rendezvous.endpoint : options.rdzv;
    auto [host, port] = split_endpoint(config.endpoint);
    if (options.node_rank == 0 && !port_taken(port)) {
      server = std::make_unique<rendezvous::RendezvousServer>(
          rendezvous::server_options_from_spec(spec, config.token, options.allow_slow));
      server->start((is_loopback(host) ? "127.0.0.1:" : "0.0.0.0:") + std::to_string(port));
      DTRAIN_INFO("rendezvous server for {} node(s) listening on port {}", spec.cluster.nodes_max,
                  port);
    } else if (options.node_rank == 0) {
      DTRAIN_INFO("port {} is taken: joining the rendezvous already there", port);
    }
  }
  auto [rdzv_host, rdzv_port] = split_endpoint(config.endpoint);
  (void)rdzv_port;
  config.hostname = hostname();
  config.host = is_loopback(rdzv_host) ? "127.0.0.1" : config.hostname;
  config.node_id = config.host + ":" + std::to_string(::getpid());

  rendezvous::ClientOptions client_options;
  client_options.endpoint = config.endpoint;
  client_options.job = config.job;
  client_options.token = config.token;
  client_options.call_timeout_s = std::clamp(2.0 * spec.cluster.rendezvous.heartbeat_s, 1.0, 10.0);
  rendezvous::RendezvousClient client(client_options);

  Agent agent(spec, config, client);
  int code = agent.run();
  if (server && code == 0 && agent.num_nodes() > 1) wait_for_other_nodes(client, config.node_id);
  return code;
}

}  // namespace dtrain::launcher
