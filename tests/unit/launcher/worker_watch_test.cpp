// Unit tests: the worker watch (launcher/worker_watch.h) stops, when its
// agent is gone, a worker the agent had not registered yet, found by the
// DTRAIN_AGENT_PID in its environment.
#include <doctest/doctest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "launcher/session_signal.h"
#include "launcher/worker_watch.h"

namespace {

// `sleep 30` in its own session with `env` as its whole environment.
pid_t spawn_sleeper(const std::vector<std::string>& env) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawnp(&pid, "sleep", nullptr, &attr, argv, envp.data()) == 0);
  posix_spawnattr_destroy(&attr);
  return pid;
}

// True when pid ended within `seconds` (reaped here: it is our child).
bool ended(pid_t pid, double seconds) {
  for (int i = 0; i < int(seconds * 100); ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("worker watch: an unregistered worker with the gone agent's DTRAIN_AGENT_PID is stopped") {
  // The marker only has to be unique among live processes' environments.
  const std::string agent = std::to_string(::getpid()) + "77";
  const pid_t marked = spawn_sleeper({"PATH=/usr/bin:/bin", "DTRAIN_AGENT_PID=" + agent});
  const pid_t other = spawn_sleeper({"PATH=/usr/bin:/bin", "DTRAIN_AGENT_PID=" + agent + "1"});
  // Its exec may still be under way: the marker is in /proc/PID/environ once it ran.
  for (int i = 0; i < 500 && dtrain::launcher::sessions_with_env("DTRAIN_AGENT_PID=" + agent).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(dtrain::launcher::sessions_with_env("DTRAIN_AGENT_PID=" + agent) == std::vector<pid_t>{marked});
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  std::thread watch([&] { dtrain::launcher::run_worker_watch(sv[1], 5.0, std::atoi(agent.c_str())); });
  ::close(sv[0]);  // the agent is gone before it sent "+<sid>"
  watch.join();
  ::close(sv[1]);
  ::signal(SIGINT, SIG_DFL);  // the watch ignores them (it runs as its own process in dtrain)
  ::signal(SIGHUP, SIG_DFL);
  const bool marked_ended = ended(marked, 5);
  CHECK(marked_ended);
  CHECK_FALSE(ended(other, 0.2));  // another agent's worker is left alone
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  if (!marked_ended) {
    ::kill(marked, SIGKILL);
    ::waitpid(marked, nullptr, 0);
  }
}
