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

// "dp=1,tp=0,..." into key -> value; false (with *problem) on bad syntax.
bool parse_pairs(const std::string& text, std::vector<std::pair<std::string, long>>& pairs,
                 std::string* problem) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    long v = 0;
    if (eq == std::string::npos || !parse_int(item.substr(eq + 1), v)) {
      *problem = "'" + item + "' is not AXIS=INTEGER";
      return false;
    }
    pairs.emplace_back(item.substr(0, eq), v);
  }
  return true;
}

}  // namespace

mesh::Shape parse_mesh(const std::string& text, const std::string& what) {
  std::vector<std::pair<std::string, long>> pairs;
  std::string problem;
  mesh::Shape s;
  if (parse_pairs(text, pairs, &problem)) {
    for (auto& [key, v] : pairs) {
      int* slot = key == "dp" ? &s.dp : key == "tp" ? &s.tp : key == "pp" ? &s.pp
                : key == "ep" ? &s.ep : nullptr;
      if (!slot) problem = "unknown axis '" + key + "'";
      else if (v < 1) problem = key + " = " + std::to_string(v) + " must be >= 1";
      else *slot = static_cast<int>(v);
      if (!problem.empty()) break;
    }
  }
  if (problem.empty() && (s.dp * s.tp) % s.ep != 0)
    problem = "ep(" + std::to_string(s.ep) + ") does not divide dp(" + std::to_string(s.dp) +
              ") * tp(" + std::to_string(s.tp) + ")";
  if (!problem.empty())
    throw Error(ErrorCode::config, what + "=" + text + ": " + problem,
                "use the form dp=2,tp=2,pp=1,ep=1 (axes dp, tp, pp, ep; each >= 1)");
  return s;
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
  if (const char* v = std::getenv("GLOO_SOCKET_IFNAME")) w.gloo_socket_ifname = v;

  w.shape.dp = w.world;  // no DTRAIN_MESH: pure data parallel
  if (const char* m = std::getenv("DTRAIN_MESH"); m && *m) {
    try {
      w.shape = parse_mesh(m);
      if (w.shape.world() != w.world)
        errors.add("DTRAIN_MESH=" + std::string(m) + ": dp(" + std::to_string(w.shape.dp) +
                   ") * tp(" + std::to_string(w.shape.tp) + ") * pp(" + std::to_string(w.shape.pp) +
                   ") = " + std::to_string(w.shape.world()) + " != WORLD_SIZE " +
                   std::to_string(w.world));
    } catch (const Error& e) {
      errors.add(e.message());
    }
  }
  errors.throw_if_any();
  w.coord = mesh::coord_of(w.shape, w.rank);
  if (const char* c = std::getenv("DTRAIN_COORD"); c && *c) {
    std::string expect = mesh::format_coord(w.coord);
    if (expect != c)
      errors.add("DTRAIN_COORD=" + std::string(c) + " but rank " + std::to_string(w.rank) +
                 " of mesh " + mesh::format_shape(w.shape) + " is at " + expect);
  }
  errors.throw_if_any();
  return w;
}

}  // namespace dtrain::engine::comm
