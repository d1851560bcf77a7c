// SlurmEnv (see slurm.h).
#include "launcher/slurm.h"

#include <cstdlib>

#include "common/error.h"

namespace dtrain::launcher {

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0)
    throw Error(ErrorCode::config, std::string(name) + " = '" + v + "' is not a number",
                "unset it, or run under a SLURM allocation");
  return static_cast<int>(n);
}

}  // namespace

SlurmEnv SlurmEnv::from_environment() {
  SlurmEnv s;
  s.node_rank = env_int("SLURM_NODEID");
  s.nodes = env_int("SLURM_NNODES");
  s.present = s.node_rank >= 0 && s.nodes > 0;
  if (const char* list = std::getenv("SLURM_JOB_NODELIST")) s.first_host = slurm_first_host(list);
  return s;
}

std::string slurm_first_host(const std::string& nodelist) {
  std::string host;
  int depth = 0;
  bool taking = true;  // inside brackets: copy only the first value of the range list
  for (char c : nodelist) {
    if (depth == 0 && c == ',') break;
    if (c == '[') {
      ++depth;
      taking = true;
    } else if (c == ']') {
      --depth;
    } else if (depth > 0) {
      if (c == ',' || c == '-') taking = false;
      if (taking) host += c;
    } else {
      host += c;
    }
  }
  return host;
}

}  // namespace dtrain::launcher
