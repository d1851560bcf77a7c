// ExitStatus decoding and the signal-name table (see exit_status.h).
// A table rather than sigabbrev_np(): that needs glibc 2.32 and we name
// only what POSIX/Linux define, in a stable spelling.
#include "launcher/exit_status.h"

#include <signal.h>
#include <sys/wait.h>

namespace dtrain::launcher {

namespace {

struct SignalEntry {
  int number;
  const char* name;
};

constexpr SignalEntry kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},     {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
    {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"},
#ifdef SIGSTKFLT
    {SIGSTKFLT, "SIGSTKFLT"},
#endif
};

}  // namespace

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

std::string signal_name(int sig) {
  for (const auto& entry : kSignals)
    if (entry.number == sig) return entry.name;
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) {
    return sig == SIGRTMIN ? "SIGRTMIN" : "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  }
  return "SIG" + std::to_string(sig);
}

}  // namespace dtrain::launcher
