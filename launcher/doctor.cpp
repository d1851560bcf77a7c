// launcher/doctor.h: runs dtrain-worker doctor (popen: the CLI has no other
// threads at that point) and logs the start-of-launch summary.
#include "launcher/doctor.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "common/error.h"
#include "common/job_spec.h"
#include "common/log.h"

namespace dtrain::launcher {

EngineFacts engine_facts_from_worker(const std::string& worker, double seconds) {
  EngineFacts none;
  if (::access(worker.c_str(), X_OK) != 0) {
    none.error = worker + " does not exist";
    return none;
  }
  std::string quoted = "'";
  for (char c : worker) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = quoted + " doctor --seconds " + std::to_string(seconds);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    none.error = "cannot run " + cmd;
    return none;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0) {
    none.error = cmd + " failed (" +
                 (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                      : "exit " + std::to_string(WEXITSTATUS(status))) +
                 ")";
    return none;
  }
  return engine_facts_from_json(out, cmd);
}

void log_launch_summary(const JobSpec& spec) {
  MachineFacts f;
  f.host = gather_host_facts();
  f.engine.available = true;  // measured by the workers at start-up, not here
  const HostFacts& h = f.host;
  MachineFacts host_only = f;
  host_only.engine.available = false;
  DTRAIN_INFO("doctor: {} ({}); the workers check and measure BLAS at start-up; `dtrain doctor` "
              "shows all", doctor_summary(host_only), h.cpu_model);
  for (const auto& w : doctor_warnings(f, spec.cluster.procs_per_node))
    DTRAIN_WARN("doctor: {}; fix: {}", w.message, w.fix);
}

}  // namespace dtrain::launcher
