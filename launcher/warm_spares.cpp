// WarmSpares (see warm_spares.h). A spare is a Process whose stdin is a pipe
// the agent holds; the environment goes down it in one write that fits the
// pipe's buffer, so take() never waits for the spare.
#include "launcher/warm_spares.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "launcher/session_signal.h"

namespace dtrain::launcher {

namespace {

bool read_at_load(const std::string& kv) {
  static const char* const kPrefixes[] = {"LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_", "TORCH_"};
  for (const char* p : kPrefixes)
    if (kv.rfind(p, 0) == 0) return true;
  return false;
}

// Writes all of data, or returns false (the spare is gone: EPIPE).
bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::vector<std::string> load_time_env(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const auto& kv : env)
    if (read_at_load(kv)) out.push_back(kv);
  std::sort(out.begin(), out.end());
  return out;
}

std::string spare_payload(const std::vector<std::string>& env) {
  std::string out;
  for (const auto& kv : env) {
    out += kv;
    out += '\0';
  }
  out += '\0';
  return out;
}

WarmSpares::~WarmSpares() {
  for (auto& s : spares_) discard(s);
}

void WarmSpares::discard(Spare& spare) {
  if (spare.fd >= 0) ::close(spare.fd);  // EOF: an idle spare exits on its own
  spare.fd = -1;
  if (!spare.process) return;
  const pid_t pid = spare.process->pid();
  spare.process.reset();  // SIGKILLs its group and reaps it
  if (watch_) watch_->forget(pid);
  remove_shm_segments_of(pid);
}

void WarmSpares::fill(const std::vector<WorkerSpec>& like) {
  if (spares_.size() < like.size()) spares_.resize(like.size());
  for (size_t slot = 0; slot < like.size(); ++slot) {
    Spare& spare = spares_[slot];
    if (spare.process && !spare.process->try_reap()) continue;  // still idle
    discard(spare);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      DTRAIN_WARN("warm spare: pipe2: {}; restarts start new processes", std::strerror(errno));
      return;
    }
    WorkerSpec spec = like[slot];
    spec.env.push_back(std::string(kWarmSpareEnv) + "=1");
    try {
      spare.process = std::make_unique<Process>(spec, fds[0]);
    } catch (const Error& e) {
      ::close(fds[0]);
      ::close(fds[1]);
      DTRAIN_WARN("warm spare: {}; restarts start new processes", e.message());
      return;
    }
    ::close(fds[0]);
    spare.fd = fds[1];
    spare.env = like[slot].env;
    if (watch_) watch_->watch(spare.process->pid());
    DTRAIN_DEBUG("warm spare for local rank {}: pid {}", slot, spare.process->pid());
  }
}

std::unique_ptr<Process> WarmSpares::take(size_t slot, const WorkerSpec& spec, bool keep_channel) {
  if (slot >= spares_.size() || !spares_[slot].process) return nullptr;
  Spare& spare = spares_[slot];
  const std::string payload = spare_payload(spec.env);
  const int capacity = ::fcntl(spare.fd, F_GETPIPE_SZ);
  std::string why;
  if (spare.process->try_reap())
    why = "it exited";
  else if (load_time_env(spare.env) != load_time_env(spec.env))
    why = "the environment read while libraries load changed";
  else if (capacity < 0 || payload.size() > static_cast<size_t>(capacity))
    why = "the environment does not fit its pipe";
  else if (!write_all(spare.fd, payload))
    why = std::string("writing its environment failed: ") + std::strerror(errno);
  if (!why.empty()) {
    DTRAIN_WARN("warm spare of local rank {} (pid {}) not used: {}; starting a new process", slot,
                spare.process->pid(), why);
    discard(spare);
    return nullptr;
  }
  if (keep_channel)
    spare.process->set_channel_fd(spare.fd);
  else
    ::close(spare.fd);
  spare.fd = -1;
  spare.env.clear();
  return std::move(spare.process);
}

pid_t WarmSpares::pid(size_t slot) const {
  if (slot >= spares_.size() || !spares_[slot].process) return -1;
  return spares_[slot].process->pid();
}

}  // namespace dtrain::launcher
