// WorkerWatch (worker_watch.h). The agent has gRPC threads, so the watcher is
// started with posix_spawn (fork + exec in one step), never a bare fork. Its
// end of the socket is its stdin; the agent's end is close-on-exec, so no
// worker inherits it and the agent's death is the socket's EOF.
#include "launcher/worker_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "common/log.h"
#include "launcher/session_signal.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Waits until the sessions have no live process or `seconds` pass.
bool wait_sessions_empty(const std::vector<pid_t>& sids, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    if (session_members(sids).empty()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// SIGTERM, grace_s, SIGKILL: torchelastic's escalation, over whole sessions.
void stop_sessions(const std::vector<pid_t>& sids, double grace_s, pid_t agent) {
  const int n = signal_sessions(sids, SIGTERM);
  DTRAIN_WARN("the agent (pid {}) is gone: sent SIGTERM to the {} process(es) of its {} worker "
              "session(s); SIGKILL after {} s",
              agent, n, sids.size(), grace_s);
  if (wait_sessions_empty(sids, grace_s)) return;
  const int left = signal_sessions(sids, SIGKILL);
  DTRAIN_WARN("SIGKILLed {} worker process(es) still running after {} s", left, grace_s);
  if (!wait_sessions_empty(sids, 5.0))
    DTRAIN_ERROR("worker processes survived SIGKILL (uninterruptible sleep?): {}",
                 session_members(sids).size());
}

}  // namespace

std::unique_ptr<WorkerWatch> WorkerWatch::start(double grace_s) {
  // Only `dtrain` knows the watcher command: an agent inside another program
  // (none today) would otherwise run that program with it.
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec || exe.filename() != "dtrain") {
    DTRAIN_DEBUG("no worker watch: this program is {}, not dtrain", exe.string());
    return nullptr;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    DTRAIN_WARN("no worker watch (socketpair: {}): workers may outlive a killed agent",
                std::strerror(errno));
    return nullptr;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);  // dup2 clears CLOEXEC
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGTERM, SIGCHLD, SIGPIPE, SIGQUIT}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string grace = std::to_string(grace_s), agent = std::to_string(::getpid());
  std::vector<char*> argv = {const_cast<char*>("dtrain"), const_cast<char*>(kWatchWorkersCommand),
                             const_cast<char*>(grace.c_str()), const_cast<char*>(agent.c_str()),
                             nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    DTRAIN_WARN("no worker watch (posix_spawn: {}): workers may outlive a killed agent",
                std::strerror(rc));
    return nullptr;
  }
  return std::unique_ptr<WorkerWatch>(new WorkerWatch(pid, sv[0]));
}

WorkerWatch::~WorkerWatch() {
  send("q\n");
  ::close(fd_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void WorkerWatch::send(const std::string& line) {
  // MSG_NOSIGNAL: a watcher that died must not take the agent with it (SIGPIPE).
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

void WorkerWatch::watch(pid_t sid) { send("+" + std::to_string(sid) + "\n"); }
void WorkerWatch::forget(pid_t sid) { send("-" + std::to_string(sid) + "\n"); }
void WorkerWatch::remove_on_death(const std::string& dir) { send("m" + dir + "\n"); }

int run_worker_watch(int fd, double grace_s, pid_t agent) {
  // Own session: no terminal signals. SIGINT and SIGHUP reach it only when
  // sent to it by pid; it keeps watching then, it ends on EOF or "q".
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  std::set<pid_t> sids;
  std::string shm_dir;  // removed after the sessions are stopped
  std::string pending;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF (or an error): the agent is gone
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line == "q") return 0;
      if (line.size() < 2) continue;
      if (line[0] == 'm') {
        shm_dir = line.substr(1);
        continue;
      }
      const pid_t sid = static_cast<pid_t>(std::atol(line.c_str() + 1));
      if (sid <= 1) continue;
      if (line[0] == '+') sids.insert(sid);
      if (line[0] == '-') sids.erase(sid);
    }
  }
  // A worker spawned just before the agent died may not be registered yet
  // (its "+" line never sent) though it already runs: found by the
  // DTRAIN_AGENT_PID its environment carries (worker_env.h).
  size_t unregistered = 0;
  for (pid_t sid : sessions_with_env("DTRAIN_AGENT_PID=" + std::to_string(agent)))
    if (sid != ::getsid(0) && sids.insert(sid).second) ++unregistered;
  if (unregistered > 0)
    DTRAIN_WARN("the agent (pid {}) is gone with {} worker session(s) it had not registered yet",
                agent, unregistered);
  if (!sids.empty()) stop_sessions(std::vector<pid_t>(sids.begin(), sids.end()), grace_s, agent);
  for (pid_t sid : sids) remove_shm_segments_of(sid);  // workers are session leaders: sid = pid
  if (!shm_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(shm_dir, ec);
  }
  return 0;
}

}  // namespace dtrain::launcher
