// RunDirLock: a run directory (checkpoint.dir, log.dir) belongs to one job.
// An advisory flock on <dir>/.dtrain.lock, whose text names the holder (pid,
// host, start time, job, job id, rendezvous). The lock belongs to the job,
// not to a process: an agent of the same job (same job id) shares the
// directory instead of refusing, and workers never take it. It does not decide what
// happens to the directory's contents (checkpoint_start.h does).
#pragma once

#include <memory>
#include <string>

namespace dtrain::launcher {

constexpr const char* kLockFile = ".dtrain.lock";
constexpr const char* kTokenFile = ".dtrain.token";  // a one-machine job's generated token (0600), while it runs

// Who holds (or last held) a lock: the lines of the lock file.
struct LockOwner {
  long pid = 0;
  std::string host;
  std::string started;  // UTC, ISO 8601
  std::string job;
  std::string job_id;   // same for every agent of one job (job_id_of)
  std::string rdzv;     // the rendezvous endpoint the agent joins ("" for a one-machine job)
  std::string endpoint; // where the running job's rendezvous answers (`dtrain status LOG_DIR`), once known

  std::string to_text() const;
  static LockOwner from_text(const std::string& text);
  // "job 'x' (pid 12, host h, since 2025-01-01T10:00:00Z)"
  std::string describe() const;
};

// The job id of a job: a hash of its name, its rendezvous token and its
// rendezvous endpoint, so every agent of one job computes the same id and
// another job (another token, or the same name and token at another
// rendezvous) never does. The endpoint's host is compared case-blind.
std::string job_id_of(const std::string& job, const std::string& token, const std::string& rdzv);

// This agent as a lock holder: pid, host, now.
LockOwner this_agent(const std::string& job, const std::string& job_id, const std::string& host,
                     const std::string& rdzv = "");

class RunDirLock {
 public:
  // Creates dir (mkdir -p) and takes its lock. When another agent of the same
  // job holds it, the directory is shared (holds() is false). When another job
  // holds it, throws dtrain::Error(config) naming field, dir and the holder.
  // A lock left by a dead process is taken over with a warning.
  RunDirLock(const std::string& dir, const std::string& field, const LockOwner& me);
  ~RunDirLock();  // clears the holder's text and releases
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  bool holds() const { return fd_ >= 0; }
  // Adds the rendezvous' real address to the lock's text (a one-machine
  // job's server listens on a port chosen at start). Only when holds().
  void record_endpoint(const std::string& endpoint);
  const std::string& dir() const { return dir_; }
  const LockOwner& holder() const { return holder_; }  // who holds it (this agent when holds())

 private:
  std::string dir_;
  int fd_ = -1;
  LockOwner holder_;
};

}  // namespace dtrain::launcher
