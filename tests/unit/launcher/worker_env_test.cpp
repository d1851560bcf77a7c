// Unit tests: the worker environment contract (launcher/worker_env.h).
#include <doctest/doctest.h>

#include <map>

#include "launcher/worker_env.h"

using namespace dtrain;

namespace {

std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const auto& kv : env) {
    auto eq = kv.find('=');
    REQUIRE(eq != std::string::npos);
    CHECK(m.count(kv.substr(0, eq)) == 0);  // every name once
    m[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

rendezvous::Assignment two_node_assignment() {
  rendezvous::Assignment a;
  a.round = 3;
  a.node_rank = 1;
  a.num_nodes = 2;
  a.mesh = mesh::make_mesh(2, 2, 2, 1);
  a.world = 8;
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  for (int d = 0; d < 4; ++d) {
    rendezvous::RankPlacement p;
    p.rank = 4 + d;
    p.node = 1;
    p.device = d;
    p.coord = mesh::coord_of(a.mesh, p.rank);  // tp = d % 2, dp = d / 2, pp = 1
    a.local_ranks.push_back(p);
  }
  return a;
}

}  // namespace

TEST_CASE("worker_env: torchrun names, DTRAIN_*, overrides") {
  auto a = two_node_assignment();
  launcher::WorkerEnvInputs in;
  in.base = {"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=7", "TORCHELASTIC_USE_AGENT_STORE=True"};
  in.assignment = &a;
  in.restart = 2;
  in.max_restarts = 3;
  in.job = "j";
  in.spec_path = "/r/spec.resolved.yaml";
  in.run_dir = "/r";
  in.cores = 16;
  in.extra_env = {"FOO=bar", "MKL_NUM_THREADS=9"};
  auto env = as_map(launcher::worker_env(in, a.local_ranks[3]));
  CHECK(env["PATH"] == "/bin");
  CHECK(env["RANK"] == "7");  // contract beats the inherited value
  CHECK(env["WORLD_SIZE"] == "8");
  CHECK(env["LOCAL_RANK"] == "3");
  CHECK(env["LOCAL_WORLD_SIZE"] == "4");
  CHECK(env["GROUP_RANK"] == "1");
  CHECK(env["GROUP_WORLD_SIZE"] == "2");
  CHECK(env["ROLE_RANK"] == "7");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "29500");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "3");
  CHECK(env.count("TORCHELASTIC_USE_AGENT_STORE") == 0);  // rank 0 hosts the store
  CHECK(env["DTRAIN_MESH"] == "tp=2,cp=1,dp=2,pp=2,ep=1");  // axes innermost first
  CHECK(env["DTRAIN_COORD"] == "tp=1,cp=0,dp=1,pp=1,ep=0");
  CHECK(env["DTRAIN_RESTART"] == "2");
  CHECK(env["DTRAIN_SPEC"] == "/r/spec.resolved.yaml");
  CHECK(env["DTRAIN_RUN_DIR"] == "/r");
  CHECK(env["DTRAIN_ERROR_FILE"] == "/r/error_rank_7.json");
  CHECK(env["TORCHELASTIC_ERROR_FILE"] == "/r/error_rank_7.json");
  CHECK(env["OMP_NUM_THREADS"] == "7");       // already set: kept
  CHECK(env["OPENBLAS_NUM_THREADS"] == "4");  // 16 cores / 4 workers
  CHECK(env["MKL_NUM_THREADS"] == "9");       // extra_env applied last
  CHECK(env["FOO"] == "bar");
}

TEST_CASE("worker_env: threads are at least 1") {
  auto a = two_node_assignment();
  launcher::WorkerEnvInputs in;
  in.assignment = &a;
  in.cores = 2;
  auto env = as_map(launcher::worker_env(in, a.local_ranks[0]));
  CHECK(env["OMP_NUM_THREADS"] == "1");
  CHECK(env["OPENBLAS_NUM_THREADS"] == "1");
  CHECK(env["MKL_NUM_THREADS"] == "1");
}
