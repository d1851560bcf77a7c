// Process (see process.h). The child gets: stdin from /dev/null, stdout and
// stderr on one pipe, its own session (so its own process group), an empty
// signal mask and default dispositions for the signals dtrain handles or ignores.
#include "launcher/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace dtrain::launcher {

namespace {

// posix_spawn attributes: own session and group (sid = pgid = pid), clean
// mask and dispositions. A session per worker, as torchrun starts its workers
// (start_new_session): where the kernel groups scheduling by session
// (sched_autogroup_enabled = 1, the default of most distributions), each rank
// then gets a session's CPU share on a shared machine, as torchrun's ranks
// do, instead of all ranks sharing the launcher's. setsid also makes the
// child its group's leader (setpgid would then fail: no SETPGROUP).
void init_attributes(posix_spawnattr_t* attr) {
  posix_spawnattr_init(attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(attr, &empty);
  posix_spawnattr_setsigdefault(attr, &defaults);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string proc_stat_fields(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return "";
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  return close_paren ? std::string(close_paren + 1) : "";
}

int64_t process_cpu_ns(pid_t pid) {
  // State is field 3, utime and stime fields 14 and 15.
  const std::string fields = proc_stat_fields(pid);
  unsigned long long utime = 0, stime = 0;
  if (std::sscanf(fields.c_str(), " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
    return 0;
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return int64_t((utime + stime) * (1'000'000'000LL / (ticks > 0 ? ticks : 100)));
}

Process::Process(const WorkerSpec& spec, int stdin_fd) {
  if (spec.argv.empty()) throw Error(ErrorCode::config, "entrypoint is empty", "give a command");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(ErrorCode::internal, std::string("pipe2: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdin_fd >= 0)
    posix_spawn_file_actions_adddup2(&actions, stdin_fd, STDIN_FILENO);
  else
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);  // dup2 clears CLOEXEC
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  init_attributes(&attr);
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  int rc = ::posix_spawnp(&pid_, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error(ErrorCode::config,
                "cannot start worker '" + spec.argv[0] + "': " + std::strerror(rc),
                "entrypoint[0] must be an executable path or a program on PATH");
  }
  out_fd_ = fds[0];
  ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
}

Process::~Process() {
  if (!exited_) {
    signal_group(SIGKILL);
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (channel_fd_ >= 0) ::close(channel_fd_);
}

void Process::read_output(std::string* chunk) {
  char buf[16384];
  while (out_fd_ >= 0) {
    ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n > 0) {
      chunk->append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      ::close(out_fd_);
      out_fd_ = -1;
    } else {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ::close(out_fd_);
        out_fd_ = -1;
      }
      return;
    }
  }
}

std::optional<ExitStatus> Process::try_reap() {
  if (exited_) return std::nullopt;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return std::nullopt;
  exited_ = true;
  return ExitStatus::from_wait_status(status);
}

void Process::signal_group(int sig) const {
  // The group outlives its leader while anything it spawned is alive, so
  // signal it even after the worker itself exited.
  if (pid_ > 0) ::kill(-pid_, sig);
}

}  // namespace dtrain::launcher
