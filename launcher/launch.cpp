// launch(): `dtrain launch` as a library call. Resolves the entrypoint, the
// run directory and the rendezvous (embedded server on one machine / node 0,
// else a client of --rdzv), then runs the Agent. Exit-code rules: launch.h.
// The run directories are locked for the whole call.
#include "launcher/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/log.h"
#include "plan/model_size.h"
#include "launcher/advertise.h"
#include "launcher/agent.h"
#include "launcher/checkpoint_start.h"
#include "launcher/doctor.h"
#include "launcher/gpus.h"
#include "launcher/input_checks.h"
#include "launcher/offload_checks.h"
#include "common/offload_files.h"
#include "launcher/init_from.h"
#include "launcher/run_dir_lock.h"
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
// server (a standalone `dtrain rendezvous`) already listens there. With
// SO_REUSEADDR, as the server binds: connections of a job that just ended
// linger in TIME_WAIT on its port, and must not make node 0 join a server
// that is gone instead of serving.
bool port_taken(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0;
  ::close(fd);
  return taken;
}

// Where node 0's embedded server listens: the endpoint's address when it is
// numeric (what the agents are told, nothing else); a name may resolve to a
// loopback address here (Debian's 127.0.1.1) and elsewhere to this host's
// real one, so a name keeps every address (0.0.0.0), behind TLS and the token.
std::string listen_host(const std::string& rdzv_host) {
  if (is_loopback(rdzv_host)) return "127.0.0.1";
  unsigned char buf[16];
  if (::inet_pton(AF_INET, rdzv_host.c_str(), buf) == 1) return rdzv_host;
  if (::inet_pton(AF_INET6, rdzv_host.c_str(), buf) == 1) return "[" + rdzv_host + "]";
  if (rdzv_host.size() > 2 && rdzv_host.front() == '[') return rdzv_host;
  return "0.0.0.0";
}

std::string hostname() {
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

std::string absolute_dir(const std::string& dir) {
  std::error_code ec;
  std::string out = fs::absolute(dir, ec).lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// log.dir and checkpoint.dir, locked for this job (one lock when they are
// the same directory), held until launch() returns.
struct RunDirLocks {
  std::unique_ptr<RunDirLock> log, checkpoint;
  // True when this agent decides what happens to checkpoint.dir's contents
  // (another agent of the same job may hold its lock instead).
  bool owns_checkpoints() const {
    return checkpoint ? checkpoint->holds() : log && log->holds();
  }
};

RunDirLocks lock_run_dirs(const JobSpec& spec, const LockOwner& me) {
  RunDirLocks locks;
  const std::string log_dir = absolute_dir(spec.log.dir);
  locks.log = std::make_unique<RunDirLock>(log_dir, "log.dir", me);
  if (!spec.checkpoint.dir.empty()) {
    const std::string ckpt_dir = absolute_dir(spec.checkpoint.dir);
    std::error_code ec;
    if (!fs::exists(ckpt_dir) || !fs::equivalent(ckpt_dir, log_dir, ec))
      locks.checkpoint = std::make_unique<RunDirLock>(ckpt_dir, "checkpoint.dir", me);
  }
  return locks;
}

// A run that starts from scratch starts a new metrics.jsonl (the trainer
// truncates it), new TensorBoard and timeline files: an earlier run's metrics.jsonl is
// moved to metrics.before_<time>.jsonl, its tb/ to tb.before_<time> (trace/ likewise)
// (_2, _3, ... when runs start within one second), never over another one:
// renameat2's RENAME_NOREPLACE refuses an existing name (a file system
// without it: rename after a check). When one cannot be moved the launch
// stops rather than let the trainer truncate or mix it.
void keep_earlier(const std::string& run_dir, const LockOwner& me, const std::string& name, const std::string& ext) {
  const std::string path = run_dir + "/" + name + ext;
  std::error_code ec;
  const auto status = fs::symlink_status(path);
  if (fs::is_regular_file(status) ? fs::file_size(path, ec) == 0
                                  : !fs::is_directory(status) || fs::is_empty(path, ec))
    return;
  std::string stamp = me.started;
  stamp.erase(std::remove(stamp.begin(), stamp.end(), ':'), stamp.end());
  for (int i = 1; i < 1000; ++i) {
    const std::string kept =
        run_dir + "/" + name + ".before_" + stamp + (i > 1 ? "_" + std::to_string(i) : std::string()) + ext;
    if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, kept.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == EEXIST) continue;
      if (errno != EINVAL && errno != ENOSYS) break;
      if (fs::exists(fs::symlink_status(kept))) continue;
      if (::rename(path.c_str(), kept.c_str()) != 0) break;
    }
    DTRAIN_INFO("log.dir = {}: this run starts from scratch; the earlier {} is now {}", run_dir, name + ext, kept);
    return;
  }
  throw Error(ErrorCode::config,
              "log.dir = " + run_dir + ": the earlier run's " + name + ext + " cannot be moved aside (" +
                  std::strerror(errno) + "), and this run would overwrite it",
              "move " + path + " away yourself, or give this job another log.dir");
}

void keep_earlier_metrics(const std::string& run_dir, const LockOwner& me) {
  keep_earlier(run_dir, me, "metrics", ".jsonl");
  keep_earlier(run_dir, me, "tb", "");
  keep_earlier(run_dir, me, "goodput", ".json");
  keep_earlier(run_dir, me, "trace", "");  // timeline rank files (log.trace.steps)
}

// The run directory and its spec.resolved.yaml (DTRAIN_SPEC). Nothing is
// written here: each agent writes the round's spec when its round closes
// (round_spec.h). An agent launched while the job runs (a replacement for a
// lost node) would otherwise replace the running round's file with the job's
// own numbers (dp at the largest size) just as that round's workers read it.
std::pair<std::string, std::string> run_dir_paths(const JobSpec& spec) {
  std::string run_dir = absolute_dir(spec.log.dir);
  return {run_dir, run_dir + "/spec.resolved.yaml"};
}

// <log.dir>/.dtrain.token: a one-machine job's generated token, for `dtrain
// status LOG_DIR`; created 0600 (never through a link), removed when the job ends.
class TokenFile {
 public:
  TokenFile(const std::string& run_dir, const std::string& token)
      : path_(run_dir.empty() ? "" : run_dir + "/" + kTokenFile) {
    if (path_.empty()) return;
    std::remove(path_.c_str());
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    const std::string text = token + "\n";
    if (fd < 0 || ::write(fd, text.data(), text.size()) != ssize_t(text.size()))
      DTRAIN_WARN("cannot write {}: `dtrain status` needs DTRAIN_TOKEN for this job", path_);
    if (fd >= 0) ::close(fd);
  }
  ~TokenFile() {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

 private:
  std::string path_;
};

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
  check_offload(spec, visible_gpus());  // train.offload: a GPU for host (named before cluster.device), nvme's directory
  check_devices(spec);  // before anything starts
  check_data_file(spec);
  check_init_from(spec);  // train.init_from: its weights fit this model
  plan::check_fits_memory(spec, options.allow_large);
  // Its refusals (an archive as checkpoint.dir, a `latest` outside it)
  // before any directory is created or locked; applied under the lock below.
  check_checkpoint_start(spec.checkpoint.dir.empty() ? "" : absolute_dir(spec.checkpoint.dir),
                         {options.resume_from, options.fresh});
  log_launch_summary(spec);
  AgentConfig config;
  config.entrypoint = resolve_entrypoint(spec);
  config.job = spec.job.name;
  config.console_ranks = options.console_ranks;
  config.extra_env = options.extra_env;
  config.node_rank = options.node_rank;
  config.hostname = options.hostname.empty() ? hostname() : options.hostname;

  const bool one_machine = spec.cluster.nodes_max == 1 && options.rdzv.empty();
  config.token = rendezvous::read_token(spec.cluster.rendezvous.token_file, !one_machine);
  const bool generated_token = config.token.empty();
  if (generated_token) config.token = rendezvous::random_token();

  // One job per run directory; the agent holding checkpoint.dir's lock
  // settles its old steps before any worker of the job can start (workers
  // start only after every agent has joined the round).
  // A one-machine job is this process alone; agents of a multi-node job
  // share its token and its rendezvous, so they share its directories (and
  // two jobs of one name and token at different rendezvous do not).
  const std::string rdzv = one_machine ? "" : options.rdzv.empty() ? spec.cluster.rendezvous.endpoint : options.rdzv;
  const std::string job_key = one_machine ? config.token + ":" + std::to_string(::getpid()) : config.token;
  const LockOwner me =
      this_agent(spec.job.name, job_id_of(spec.job.name, job_key, rdzv), config.hostname, rdzv);
  RunDirLocks locks = lock_run_dirs(spec, me);
  std::string from;  // the checkpoint this run resumes ("" when it starts fresh)
  if (locks.owns_checkpoints()) {
    from = prepare_checkpoint_start(
        spec.checkpoint.dir.empty() ? "" : absolute_dir(spec.checkpoint.dir),
        {options.resume_from, options.fresh});
    if (from.empty() && locks.log->holds()) keep_earlier_metrics(absolute_dir(spec.log.dir), me);
  }
  if (!options.resume_from.empty())
    config.extra_env.push_back("DTRAIN_RESUME_FROM=" +
                               fs::absolute(checkpoint::resolve(options.resume_from)).string());
  config.log_header = "job '" + spec.job.name + "' run of " + me.started + " (agent pid " +
                      std::to_string(me.pid) + " on " + me.host + ")";
  std::tie(config.run_dir, config.spec_path) = run_dir_paths(spec);
  if (!spec.train.init_from.empty() && from.empty() && options.resume_from.empty())
    config.extra_env.push_back("DTRAIN_INIT_FROM=" + prepare_init_from(spec, config.run_dir));

  // Where the rendezvous is, and which of this host's addresses the others
  // reach it at: checked before anything listens.
  if (!one_machine) config.endpoint = options.rdzv.empty() ? spec.cluster.rendezvous.endpoint : options.rdzv;
  const auto [rdzv_host, rdzv_port] =
      one_machine ? std::pair<std::string, int>{"127.0.0.1", 1} : split_endpoint(config.endpoint);
  const bool flag_addr = !options.advertise_addr.empty();
  const Advertised self = advertise_address(
      flag_addr ? options.advertise_addr : spec.cluster.rendezvous.advertise_addr,
      flag_addr ? "--advertise-addr" : "cluster.rendezvous.advertise_addr", rdzv_host, rdzv_port);
  config.host = self.addr;
  config.ifname = self.ifname;
  // Unique without DNS or a unique hostname: the address plus the agent's pid.
  config.node_id = config.host + ":" + std::to_string(::getpid());

  std::unique_ptr<rendezvous::RendezvousServer> server;
  if (one_machine) {
    // This process's own server on loopback: the token's TLS identity,
    // whatever cluster.rendezvous.tls names (its cert names another host).
    JobSpec local = spec;
    local.cluster.rendezvous.tls_ca = local.cluster.rendezvous.tls_cert =
        local.cluster.rendezvous.tls_key = "";
    server = std::make_unique<rendezvous::RendezvousServer>(
        rendezvous::server_options_from_spec(local, config.token, options.allow_slow));
    config.endpoint = "127.0.0.1:" + std::to_string(server->start("127.0.0.1:0"));
  } else {
    const int port = rdzv_port;
    if (options.node_rank == 0 && !port_taken(port)) {
      server = std::make_unique<rendezvous::RendezvousServer>(
          rendezvous::server_options_from_spec(spec, config.token, options.allow_slow));
      server->start(listen_host(rdzv_host) + ":" + std::to_string(port));
      DTRAIN_INFO("rendezvous server for {} node(s) listening on port {}", spec.cluster.nodes_max,
                  port);
    } else if (options.node_rank == 0) {
      DTRAIN_INFO("port {} is taken: joining the rendezvous already there", port);
    }
  }

  // `dtrain status LOG_DIR` finds the job here: the endpoint in the lock, and
  // a one-machine job's generated token in a file only its owner reads.
  if (locks.log->holds()) locks.log->record_endpoint(config.endpoint);
  const TokenFile token_file(one_machine && generated_token && locks.log->holds() ? config.run_dir : "", config.token);

  rendezvous::ClientOptions client_options;
  client_options.endpoint = config.endpoint;
  client_options.job = config.job;
  client_options.token = config.token;
  if (!one_machine) client_options.tls = rendezvous::tls_identity_from_spec(spec.cluster.rendezvous);
  client_options.call_timeout_s = std::clamp(2.0 * spec.cluster.rendezvous.heartbeat_s, 1.0, 10.0);
  rendezvous::RendezvousClient client(client_options);

  Agent agent(spec, config, client);
  int code = agent.run();
  // Every worker of this machine has exited: what a SIGKILLed one left of
  // train.offload's files goes (one machine only: another machine's ranks
  // may still use a shared path).
  const bool nvme = spec.train.offload.optimizer == OffloadTarget::nvme || spec.train.offload.params == OffloadTarget::nvme;
  if (nvme && agent.num_nodes() <= 1)
    if (const int n = remove_offload_files(spec.train.offload.path, spec.job.name, 0); n > 0)
      DTRAIN_INFO("removed {} offload file(s) of stopped workers from {}", n, spec.train.offload.path);
  if (server && code == 0 && agent.num_nodes() > 1) wait_for_other_nodes(client, config.node_id);
  return code;
}

}  // namespace dtrain::launcher
