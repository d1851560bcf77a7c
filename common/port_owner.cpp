// port_owner (port_owner.h): LISTEN (state 0A) rows of /proc/net/tcp and
// tcp6, then a scan of /proc/*/fd for "socket:[inode]".
#include "common/port_owner.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace dtrain {
namespace {

std::set<std::string> listening_inodes(int port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      row >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      auto colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port && inode != "0")
        inodes.insert(inode);
    }
  }
  return inodes;
}

std::string process_name(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::string port_owner(int port) {
  const std::set<std::string> inodes = listening_inodes(port);
  if (inodes.empty()) return "";
  DIR* proc = ::opendir("/proc");
  if (!proc) return "";
  std::string found;
  while (dirent* e = ::readdir(proc)) {
    const std::string pid = e->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (!fds) continue;
    while (dirent* f = ::readdir(fds)) {
      char target[128];
      const std::string link = fd_dir + "/" + f->d_name;
      ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 9) continue;
      target[n] = '\0';
      std::string t(target);
      if (t.rfind("socket:[", 0) == 0 && inodes.count(t.substr(8, t.size() - 9))) {
        found = "pid " + pid + " (" + process_name(pid) + ")";
        break;
      }
    }
    ::closedir(fds);
    if (!found.empty()) break;
  }
  ::closedir(proc);
  return found;
}

}  // namespace dtrain
