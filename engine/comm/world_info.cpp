// WorldInfo::from_env and parse_mesh: the worker's side of the environment
// contract (docs/ARCHITECTURE.md, 'The worker's environment'). Reads and
// validates variables; every problem is collected and reported at once, each
// naming its variable. Does not connect to anything.
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "engine/comm/comm.h"

namespace dtrain::engine::comm {

namespace {

// Collects "NAME=value: problem" lines; throws them all together.
struct EnvErrors {
  std::vector<std::string> lines;

  void add(const std::string& line) { lines.push_back(line); }

  void throw_if_any() const {
    if (lines.empty()) return;
    std::string msg = "bad worker environment:";
    for (auto& l : lines) msg += "\n  " + l;
    throw Error(ErrorCode::config, msg,
                "run workers through `dtrain launch`, or set RANK, WORLD_SIZE, MASTER_ADDR and "
                "MASTER_PORT as torchrun does");
  }
};

bool parse_int(const std::string& text, long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtol(text.c_str(), &end, 10);
  return end && *end == '\0';
}

// Reads integer `name` into *out; `required` without a default records an error.
void read_int(const char* name, bool required, int min, int* out, EnvErrors& errors) {
  const char* v = std::getenv(name);
  if (!v) {
    if (required) errors.add(std::string(name) + " is not set");
    return;
  }
  long x = 0;
  if (!parse_int(v, x) || x < min || x > 1 << 30) {
    errors.add(std::string(name) + "=" + v + ": not an integer >= " + std::to_string(min));
    return;
  }
  *out = static_cast<int>(x);
}

}  // namespace

mesh::Mesh parse_mesh(const std::string& text, const std::string& what) {
  mesh::Mesh m;
  std::string problem;
  if (!mesh::parse_mesh(text, &m, &problem))
    throw Error(ErrorCode::config, what + "=" + text + ": " + problem,
                "use the form tp=2,cp=1,dp=2,pp=1,ep=1 (axes tp, cp, dp, pp innermost first, then ep; "
                "each >= 1)");
  return m;
}

WorldInfo WorldInfo::from_env() {
  WorldInfo w;
  EnvErrors errors;
  read_int("RANK", true, 0, &w.rank, errors);
  read_int("WORLD_SIZE", true, 1, &w.world, errors);
  w.local_rank = w.rank;
  w.local_world = w.world;
  read_int("LOCAL_RANK", false, 0, &w.local_rank, errors);
  read_int("LOCAL_WORLD_SIZE", false, 1, &w.local_world, errors);
  read_int("GROUP_RANK", false, 0, &w.node_rank, errors);
  read_int("MASTER_PORT", true, 1, &w.master_port, errors);
  read_int("DTRAIN_RESTART", false, 0, &w.restart, errors);
  if (w.master_port > 65535) errors.add("MASTER_PORT=" + std::to_string(w.master_port) + ": not a port");
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) w.master_addr = a;
  else errors.add("MASTER_ADDR is not set");
  if (w.rank >= w.world)
    errors.add("RANK=" + std::to_string(w.rank) + " is not below WORLD_SIZE=" + std::to_string(w.world));
  if (const char* v = std::getenv("DTRAIN_SPEC")) w.spec_path = v;
  if (const char* v = std::getenv("DTRAIN_RUN_DIR")) w.run_dir = v;
  if (const char* v = std::getenv("DTRAIN_RESUME_FROM")) w.resume_from = v;
  if (const char* v = std::getenv("DTRAIN_INIT_FROM")) w.init_from = v;
  if (const char* v = std::getenv("GLOO_SOCKET_IFNAME")) w.gloo_socket_ifname = v;
  if (const char* v = std::getenv("DTRAIN_MEMORY_DIR")) w.memory_dir = v;
  if (const char* v = std::getenv("DTRAIN_EVAL_CKPT")) w.eval.ckpt = v;
  if (!w.eval.ckpt.empty()) read_int("DTRAIN_EVAL_BATCHES", true, 1, &w.eval.windows, errors);
  if (const char* v = std::getenv("DTRAIN_EVAL_OUT")) w.eval.out = v;

  w.mesh.size(mesh::Axis::dp) = w.world;  // no DTRAIN_MESH: pure data parallel
  if (const char* m = std::getenv("DTRAIN_MESH"); m && *m) {
    try {
      w.mesh = parse_mesh(m);
      if (w.mesh.world() != w.world)
        errors.add("DTRAIN_MESH=" + std::string(m) + ": dp(" + std::to_string(w.mesh.dp()) + ") * tp(" +
                   std::to_string(w.mesh.tp()) + ") * pp(" + std::to_string(w.mesh.pp()) + ")" +
                   (w.mesh.cp() > 1 ? " * cp(" + std::to_string(w.mesh.cp()) + ")" : std::string()) + " = " +
                   std::to_string(w.mesh.world()) + " != WORLD_SIZE " + std::to_string(w.world));
    } catch (const Error& e) {
      errors.add(e.message());
    }
  }
  errors.throw_if_any();
  w.coord = mesh::coord_of(w.mesh, w.rank);
  if (const char* c = std::getenv("DTRAIN_COORD"); c && *c) {
    // Every AXIS=INDEX it names must be this rank's (any order, ep included).
    std::string expect = mesh::format_coord(w.mesh, w.coord), item;
    std::stringstream ss(c);
    bool same = true;
    while (std::getline(ss, item, ','))
      same = same && ("," + expect + ",").find("," + item + ",") != std::string::npos;
    if (!same)
      errors.add("DTRAIN_COORD=" + std::string(c) + " but rank " + std::to_string(w.rank) +
                 " of mesh " + mesh::format_mesh(w.mesh) + " is at " + expect);
  }
  errors.throw_if_any();
  return w;
}

}  // namespace dtrain::engine::comm
