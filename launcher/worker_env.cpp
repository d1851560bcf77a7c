// worker_env (see worker_env.h). Variables that torch.distributed reads are
// set as torchrun sets them, except TORCHELASTIC_USE_AGENT_STORE: dtrain's
// agent hosts no TCPStore, so rank 0 creates it (plain env:// behaviour).
#include "launcher/worker_env.h"

#include <algorithm>
#include <map>

#include "common/mesh.h"

namespace dtrain::launcher {

std::string error_file_path(const std::string& run_dir, int rank) {
  return run_dir + "/error_rank_" + std::to_string(rank) + ".json";
}

std::vector<std::string> worker_env(const WorkerEnvInputs& in,
                                    const rendezvous::RankPlacement& local) {
  const auto& a = *in.assignment;
  std::map<std::string, std::string> env;
  for (const auto& kv : in.base) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  int local_world = static_cast<int>(a.local_ranks.size());
  std::string threads = std::to_string(std::max(1, in.cores / std::max(1, local_world)));
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
    if (!env.count(name)) env[name] = threads;

  auto set = [&env](const std::string& k, const std::string& v) { env[k] = v; };
  auto num = [](long long v) { return std::to_string(v); };
  set("RANK", num(local.rank));
  set("WORLD_SIZE", num(a.world));
  set("LOCAL_RANK", num(local.device));
  set("LOCAL_WORLD_SIZE", num(local_world));
  set("GROUP_RANK", num(a.node_rank));
  set("GROUP_WORLD_SIZE", num(a.num_nodes));
  set("ROLE_RANK", num(local.rank));
  set("ROLE_WORLD_SIZE", num(a.world));
  set("ROLE_NAME", "default");
  set("MASTER_ADDR", a.master_addr);
  set("MASTER_PORT", num(a.master_port));
  set("TORCHELASTIC_RESTART_COUNT", num(in.restart));
  set("TORCHELASTIC_MAX_RESTARTS", num(in.max_restarts));
  set("TORCHELASTIC_RUN_ID", in.job);
  env.erase("TORCHELASTIC_USE_AGENT_STORE");
  // The rendezvous token authenticates agents; no worker reads it (the
  // builtin engine, torch.distributed and the contract above need none), so
  // it stays out of every worker's environment (and /proc/PID/environ);
  // only a caller's extra_env (below) could put it back, on purpose.
  env.erase("DTRAIN_TOKEN");
  env.erase("DTRAIN_WARM_SPARE");  // only a warm spare waits for its environment (warm_spares.h)
  set("TORCHELASTIC_ERROR_FILE", error_file_path(in.run_dir, local.rank));

  set("DTRAIN_MESH", mesh::format_mesh(a.mesh));
  set("DTRAIN_COORD", mesh::format_coord(a.mesh, local.coord));
  set("DTRAIN_RESTART", num(in.restart));
  set("DTRAIN_SPEC", in.spec_path);
  set("DTRAIN_RUN_DIR", in.run_dir);
  set("DTRAIN_ERROR_FILE", error_file_path(in.run_dir, local.rank));
  if (in.agent_pid > 0) set("DTRAIN_AGENT_PID", num(in.agent_pid));
  // Gloo binds where the hostname resolves unless told an interface; on hosts
  // that share one name (or whose name maps to 127.x) that is unreachable.
  if (!in.gloo_ifname.empty() && in.gloo_ifname != "lo" && !env.count("GLOO_SOCKET_IFNAME"))
    set("GLOO_SOCKET_IFNAME", in.gloo_ifname);

  for (const auto& kv : in.extra_env) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace dtrain::launcher
