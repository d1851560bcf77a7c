// RunDirLock (run_dir_lock.h): flock(LOCK_EX | LOCK_NB) on an O_NOFOLLOW lock
// file. The kernel drops a flock when its holder dies, so a lock file whose
// text names a process is only "stale" text once the flock is ours.
#include "launcher/run_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[1024];
  off_t off = 0;
  for (;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n <= 0 || text.size() > 64 * 1024) break;
    text.append(buf, size_t(n));
    off += n;
  }
  return text;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool pid_alive(long pid) { return pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM); }

[[noreturn]] void refuse(const std::string& field, const std::string& dir, const std::string& what,
                         const std::string& hint) {
  throw Error(ErrorCode::config, field + " = " + dir + ": " + what, hint);
}

}  // namespace

std::string LockOwner::to_text() const {
  return "pid=" + std::to_string(pid) + "\nhost=" + host + "\nstarted=" + started +
         "\njob=" + job + "\njob_id=" + job_id + "\nrdzv=" + rdzv + "\n" +
         (endpoint.empty() ? "" : "endpoint=" + endpoint + "\n");
}

LockOwner LockOwner::from_text(const std::string& text) {
  LockOwner o;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "pid") o.pid = std::strtol(v.c_str(), nullptr, 10);
    else if (k == "host") o.host = v;
    else if (k == "started") o.started = v;
    else if (k == "job") o.job = v;
    else if (k == "job_id") o.job_id = v;
    else if (k == "rdzv") o.rdzv = v;
    else if (k == "endpoint") o.endpoint = v;
  }
  return o;
}

std::string LockOwner::describe() const {
  return "job '" + job + "' (pid " + std::to_string(pid) + " on host " + host + ", since " +
         started + ")";
}

std::string job_id_of(const std::string& job, const std::string& token, const std::string& rdzv) {
  std::string endpoint = rdzv;
  for (auto& c : endpoint) c = char(std::tolower(static_cast<unsigned char>(c)));
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64: identity, not secrecy
  for (unsigned char c : job + '\n' + token + '\n' + endpoint) h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

LockOwner this_agent(const std::string& job, const std::string& job_id, const std::string& host,
                     const std::string& rdzv) {
  LockOwner me;
  me.rdzv = rdzv;
  me.pid = ::getpid();
  me.host = host;
  me.started = utc_now();
  me.job = job;
  me.job_id = job_id;
  return me;
}

RunDirLock::RunDirLock(const std::string& dir, const std::string& field, const LockOwner& me)
    : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    refuse(field, dir,
           fs::exists(dir) ? "exists and is not a directory"
                           : "cannot be created (" + ec.message() + ")",
           "give " + field + " a directory path that can be created");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    refuse(field, dir, "is not writable (" + std::string(std::strerror(errno)) + ")",
           "give " + field + " a directory you can write to");
  const std::string path = dir + "/" + kLockFile;
  // 0600: the job id is derived from the job's token; only its owner reads it.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0)
    refuse(field, dir, "cannot open its lock file " + path + " (" + std::strerror(errno) + ")",
           "remove " + path + " if it is not a regular file");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    // Held: by this job's other agent (shared) or by another job (refused).
    // The holder writes its text right after locking: give it a moment.
    LockOwner holder;
    for (int i = 0; i < 40; ++i) {
      holder = LockOwner::from_text(read_all(fd_));
      if (!holder.job_id.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      refuse(field, dir, "cannot lock " + path + " (" + std::strerror(err) + ")",
             "put " + field + " on a file system with flock support");
    if (!holder.job_id.empty() && holder.job_id == me.job_id) {
      holder_ = holder;
      return;
    }
    // The same name at another rendezvous: another job, or this job's
    // server named another way on this node.
    const bool other_rdzv = holder.job == me.job && !holder.rdzv.empty() && holder.rdzv != me.rdzv;
    refuse(field, dir,
           "is in use by " + (holder.job_id.empty() ? std::string("another process") : holder.describe()) +
               (other_rdzv ? " at rendezvous " + holder.rdzv + " (this agent's: " +
                                 (me.rdzv.empty() ? std::string("its own, one machine") : me.rdzv) + ")"
                           : std::string()) +
               "; one job per run directory",
           "wait for that job to end (or stop it" +
               (holder.pid > 0 ? ": kill " + std::to_string(holder.pid) : std::string()) +
               "), or give this job another " + field +
               (other_rdzv ? "; if both name the same rendezvous server, spell its endpoint the same way on "
                             "every node (--rdzv or cluster.rendezvous.endpoint)"
                           : std::string()));
  }
  const LockOwner old = LockOwner::from_text(read_all(fd_));
  if (old.pid > 0 && !(old.pid == me.pid && old.host == me.host)) {
    if (old.host == me.host && !pid_alive(old.pid))
      DTRAIN_WARN("{} = {}: taking over the stale lock of {}: that process is gone", field, dir,
                  old.describe());
    else
      DTRAIN_WARN("{} = {}: taking over the lock left by {}: it no longer holds it", field, dir,
                  old.describe());
  }
  holder_ = me;
  const std::string text = me.to_text();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size()))
    refuse(field, dir, "cannot write its lock file " + path + " (" + std::strerror(errno) + ")",
           "give " + field + " a directory you can write to");
  ::fsync(fd_);
}

void RunDirLock::record_endpoint(const std::string& endpoint) {
  if (fd_ < 0) return;
  holder_.endpoint = endpoint;
  const std::string text = holder_.to_text();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size()))
    DTRAIN_WARN("cannot record the rendezvous endpoint in {}/{}: `dtrain status {}` will not find it", dir_,
                kLockFile, dir_);
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) != 0) {
  }  // a lock file left with text is reported as stale next time; nothing else to do
  ::close(fd_);
}

}  // namespace dtrain::launcher
