// signal_sessions / session_members (session_signal.h): one pass over
// /proc/<pid>/stat, whose fields after the command name are state, ppid,
// pgrp and session.
#include "launcher/session_signal.h"
#include "launcher/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace dtrain::launcher {
namespace {

// Session id of `pid` (-1 when it is gone or a zombie).
pid_t live_session_of(pid_t pid) {
  const std::string fields = proc_stat_fields(pid);
  char state = 0;
  int ppid = 0, pgrp = 0, session = 0;
  if (std::sscanf(fields.c_str(), " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4) return -1;
  if (state == 'Z' || state == 'X') return -1;
  return static_cast<pid_t>(session);
}

}  // namespace

std::vector<pid_t> session_members(const std::vector<pid_t>& all) {
  std::vector<pid_t> out;
  std::vector<pid_t> sids;  // never session 0 or init's
  for (pid_t sid : all)
    if (sid > 1) sids.push_back(sid);
  if (sids.empty()) return out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  const pid_t self = ::getpid();
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 1 || *end != '\0' || pid == self) continue;
    pid_t sid = live_session_of(static_cast<pid_t>(pid));
    if (sid > 0 && std::find(sids.begin(), sids.end(), sid) != sids.end())
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return out;
}

std::vector<pid_t> sessions_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  const pid_t self = ::getpid();
  const std::string needle = std::string(1, '\0') + entry + std::string(1, '\0');
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 1 || *end != '\0' || pid == self) continue;
    const std::string path = "/proc/" + std::to_string(pid) + "/environ";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::string env(1, '\0');  // so the first entry matches the needle too
    char buf[8192];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) env.append(buf, static_cast<size_t>(n));
    ::close(fd);
    if (env.back() != '\0') env.push_back('\0');
    if (env.find(needle) == std::string::npos) continue;
    const pid_t sid = live_session_of(static_cast<pid_t>(pid));
    if (sid > 1 && std::find(out.begin(), out.end(), sid) == out.end()) out.push_back(sid);
  }
  ::closedir(proc);
  return out;
}

int signal_sessions(const std::vector<pid_t>& sids, int sig) {
  // Counted before the groups are signalled: a process that dies of the
  // group's signal at once must still count (it got the signal).
  const std::vector<pid_t> members = session_members(sids);
  for (pid_t sid : sids)
    if (sid > 1) ::kill(-sid, sig);
  int n = static_cast<int>(members.size());  // gone since the scan: ended by the group's signal
  for (pid_t pid : members) ::kill(pid, sig);   // members outside the leader's group
  for (pid_t pid : session_members(sids))       // started since the first scan
    if (std::find(members.begin(), members.end(), pid) == members.end()) n += ::kill(pid, sig) == 0 ? 1 : 0;
  return n;
}

int remove_shm_segments_of(pid_t pid) {
  if (pid <= 0) return 0;
  const std::string prefix = "dtrain-" + std::to_string(pid) + "-";
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(dir))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.emplace_back(e->d_name);
  ::closedir(dir);
  int removed = 0;
  for (const auto& name : names) removed += ::unlink(("/dev/shm/" + name).c_str()) == 0 ? 1 : 0;
  return removed;
}

}  // namespace dtrain::launcher
