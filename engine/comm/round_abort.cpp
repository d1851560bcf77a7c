// round_abort.h: one atomic flag, written by the round watcher thread and
// read by the training thread's waits, and the sockets' shutdown.
#include "engine/comm/round_abort.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"

namespace dtrain::engine::comm {
namespace {
std::atomic<bool> g_aborted{false};
std::atomic<int> g_generation{0};  // rounds this process started after its first

// The live RoundEndAborts' callbacks, by id.
struct Aborts {
  std::mutex mu;
  uint64_t next = 0;
  std::map<uint64_t, std::function<void()>> live;
};
Aborts& aborts() {
  static Aborts* a = new Aborts();  // never destroyed: a detached watcher may use it at exit
  return *a;
}
}  // namespace

void abort_round() {
  g_aborted.store(true, std::memory_order_release);
  Aborts& a = aborts();
  std::lock_guard<std::mutex> lock(a.mu);
  for (auto& [id, abort] : a.live) abort();
}

RoundEndAbort::RoundEndAbort(std::function<void()> abort) {
  Aborts& a = aborts();
  std::lock_guard<std::mutex> lock(a.mu);
  id_ = a.next++;
  a.live.emplace(id_, std::move(abort));
}

RoundEndAbort::~RoundEndAbort() {
  Aborts& a = aborts();
  std::lock_guard<std::mutex> lock(a.mu);
  a.live.erase(id_);
}

bool round_aborted() { return g_aborted.load(std::memory_order_acquire); }
bool leaving_round() { return round_aborted() || std::uncaught_exceptions() > 0; }
void clear_round_abort() {
  g_aborted.store(false, std::memory_order_release);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

int round_generation() { return g_generation.load(std::memory_order_acquire); }

void throw_if_round_aborted(const char* where) {
  if (!round_aborted()) return;
  throw Error(ErrorCode::worker_failed, std::string(where) + " left: the agent announced a new round",
              "none needed: the worker continues in the new round (cluster.recover_in_place)");
}

namespace {
// A connected TCP socket: SOCK_STREAM over IPv4/6, not listening.
bool connected_tcp(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int domain = 0, type = 0, listening = 0;
  socklen_t len = sizeof(int);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return false;
  if (domain != AF_INET && domain != AF_INET6) return false;
  len = sizeof(int);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof(int);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && !listening;
}
}  // namespace

int end_round() {
  abort_round();
  // A Gloo thread that writes on a socket shut here gets EPIPE and throws;
  // with SIGPIPE at its default it would kill the process instead (Python,
  // c10d's usual host, ignores SIGPIPE at start-up; the agent spawns workers
  // with it at the default).
  ::signal(SIGPIPE, SIG_IGN);
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  int shut = 0;
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    if (connected_tcp(int(fd)) && ::shutdown(int(fd), SHUT_RDWR) == 0) ++shut;
  }
  ::closedir(dir);
  abort_round();  // again: a wait registered since the first call
  return shut;
}

}  // namespace dtrain::engine::comm
