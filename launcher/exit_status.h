// How a worker process ended: an exit code or a terminating signal, and the
// names of signals for root-cause messages (SIGKILL, SIGSEGV, ...).
// Pure data and formatting; it does not wait for or signal processes.
#pragma once

#include <string>

namespace dtrain::launcher {

struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // terminating signal; 0 = the process exited normally

  // From a waitpid() status word.
  static ExitStatus from_wait_status(int status);

  bool success() const { return signal == 0 && exit_code == 0; }
  // What a shell reports: the exit code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 1" or "signal 9 (SIGKILL)".
  std::string describe() const;
};

// "SIGKILL" for 9; "SIGRTMIN+2" for real-time signals; "SIG<n>" otherwise.
std::string signal_name(int sig);

}  // namespace dtrain::launcher
