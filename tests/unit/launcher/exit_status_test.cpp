// Unit tests: ExitStatus decoding and signal names (launcher/exit_status.h).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher/exit_status.h"

using dtrain::launcher::ExitStatus;
using dtrain::launcher::signal_name;

TEST_CASE("signal names") {
  CHECK(signal_name(SIGKILL) == "SIGKILL");
  CHECK(signal_name(SIGSEGV) == "SIGSEGV");
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGABRT) == "SIGABRT");
  CHECK(signal_name(SIGBUS) == "SIGBUS");
  CHECK(signal_name(SIGINT) == "SIGINT");
  CHECK(signal_name(SIGRTMIN) == "SIGRTMIN");
  CHECK(signal_name(SIGRTMIN + 2) == "SIGRTMIN+2");
  CHECK(signal_name(999) == "SIG999");
  for (int sig = 1; sig < 32; ++sig) CHECK(signal_name(sig).rfind("SIG", 0) == 0);
}

TEST_CASE("ExitStatus from real processes") {
  auto run = [](int how) {
    pid_t pid = fork();  // single-threaded test binary: fork is fine here
    if (pid == 0) {
      if (how < 0) raise(-how);
      _exit(how);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return ExitStatus::from_wait_status(status);
  };
  ExitStatus ok = run(0);
  CHECK(ok.success());
  CHECK(ok.shell_code() == 0);
  CHECK(ok.describe() == "exit code 0");

  ExitStatus three = run(3);
  CHECK_FALSE(three.success());
  CHECK(three.exit_code == 3);
  CHECK(three.signal == 0);
  CHECK(three.shell_code() == 3);

  ExitStatus killed = run(-SIGKILL);
  CHECK(killed.signal == SIGKILL);
  CHECK(killed.shell_code() == 137);
  CHECK(killed.describe() == "signal 9 (SIGKILL)");
}
