// ExitStatus decoding (see exit_status.h); signal names come from
// common/signal_name.h.
#include "launcher/exit_status.h"

#include <signal.h>
#include <sys/wait.h>

#include "common/signal_name.h"

namespace dtrain::launcher {

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    s.exit_code = WEXITSTATUS(status);
  } else {
    s.exit_code = -1;  // stopped/continued: not an end state; callers do not pass these
  }
  return s;
}

std::string ExitStatus::describe() const {
  if (signal != 0) return "signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::string signal_name(int sig) { return dtrain::signal_name(sig); }

}  // namespace dtrain::launcher
