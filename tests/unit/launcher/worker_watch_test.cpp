// Unit tests: the worker watch (launcher/worker_watch.h) stops, when its
// agent is gone, a worker the agent had not registered yet, found by the
// DTRAIN_AGENT_PID in its environment, and removes the /dev/shm segments
// its stopped workers left (remove_shm_segments_of).
#include <doctest/doctest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// Creates /dev/shm/<name> (a plain file there is what shm_open makes).
std::string make_segment(const std::string& name) {
  const std::string path = "/dev/shm/" + name;
  std::ofstream(path) << "x";
  REQUIRE(std::filesystem::exists(path));
  return path;
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
  // A segment the marked worker "created" and one of the other worker's.
  const std::string marked_seg = make_segment("dtrain-" + std::to_string(marked) + "-7");
  const std::string other_seg = make_segment("dtrain-" + std::to_string(other) + "-7");
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
  CHECK_FALSE(std::filesystem::exists(marked_seg));  // the stopped worker's segment is removed
  CHECK(std::filesystem::exists(other_seg));
  std::filesystem::remove(marked_seg);
  std::filesystem::remove(other_seg);
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  if (!marked_ended) {
    ::kill(marked, SIGKILL);
    ::waitpid(marked, nullptr, 0);
  }
}

TEST_CASE("remove_shm_segments_of removes dtrain-<pid>-* of that pid only") {
  const pid_t pid = 4000000 + ::getpid() % 100000;  // above pid_max's default: no live process
  const std::string mine = make_segment("dtrain-" + std::to_string(pid) + "-12");
  const std::string longer = make_segment("dtrain-" + std::to_string(pid) + "1-12");  // pid 40000001...
  const std::string foreign = make_segment("other-" + std::to_string(pid) + "-12");
  CHECK(dtrain::launcher::remove_shm_segments_of(pid) == 1);
  CHECK_FALSE(std::filesystem::exists(mine));
  CHECK(std::filesystem::exists(longer));
  CHECK(std::filesystem::exists(foreign));
  std::filesystem::remove(mine);
  std::filesystem::remove(longer);
  std::filesystem::remove(foreign);
}
