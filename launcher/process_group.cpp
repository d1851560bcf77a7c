// ProcessGroup (see process_group.h): one poll(2) over the wake pipe and
// every worker's output pipe drives output, exits and stop deadlines.
#include "launcher/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "launcher/session_signal.h"

namespace dtrain::launcher {

ProcessGroup::ProcessGroup(int wake_fd, WorkerWatch* watch) : wake_fd_(wake_fd), watch_(watch) {}

ProcessGroup::~ProcessGroup() {
  for (auto& e : entries_) e.process->signal_group(SIGKILL);
  kill_sessions();
  std::vector<pid_t> pids;
  for (const auto& e : entries_) pids.push_back(e.process->pid());
  entries_.clear();  // ~Process reaps
  for (pid_t pid : pids) remove_shm_segments_of(pid);
}

std::vector<pid_t> ProcessGroup::sessions() const {
  std::vector<pid_t> out;
  for (const auto& e : entries_) out.push_back(e.process->pid());
  return out;
}

void ProcessGroup::kill_sessions() {
  const auto sids = sessions();
  signal_sessions(sids, SIGKILL);
  if (watch_)
    for (pid_t sid : sids) watch_->forget(sid);
}

pid_t ProcessGroup::spawn(int rank, const WorkerSpec& spec, const std::string& log_header, bool channel) {
  auto output = std::make_unique<RankOutput>(rank, spec.log_path, spec.console, log_header);
  int fds[2] = {-1, -1};
  if (channel && ::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(ErrorCode::internal, std::string("pipe2 for rank ") + std::to_string(rank) +
                                         "'s round channel: " + std::strerror(errno));
  std::unique_ptr<Process> process;
  try {
    process = std::make_unique<Process>(spec, fds[0]);
  } catch (...) {
    if (channel) ::close(fds[1]);
    if (channel) ::close(fds[0]);
    throw;
  }
  if (channel) {
    ::close(fds[0]);
    process->set_channel_fd(fds[1]);
  }
  if (watch_) watch_->watch(process->pid());  // its session id: it is the session's leader
  return add(std::move(output), std::move(process));
}

pid_t ProcessGroup::adopt(int rank, const WorkerSpec& spec, const std::string& log_header,
                          std::unique_ptr<Process> process) {
  // The warm spares told the watch of it when they started it.
  return add(std::make_unique<RankOutput>(rank, spec.log_path, spec.console, log_header), std::move(process));
}

pid_t ProcessGroup::add(std::unique_ptr<RankOutput> output, std::unique_ptr<Process> process) {
  Entry entry;
  entry.output = std::move(output);
  entry.process = std::move(process);
  pid_t pid = entry.process->pid();
  entries_.push_back(std::move(entry));
  return pid;
}

std::vector<std::unique_ptr<Process>> ProcessGroup::release() {
  std::vector<std::unique_ptr<Process>> out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    pump(i);
    entries_[i].output->flush();
    out.push_back(std::move(entries_[i].process));
  }
  entries_.clear();
  return out;
}

size_t ProcessGroup::running() const {
  size_t n = 0;
  for (const auto& e : entries_) n += e.process->exited() ? 0 : 1;
  return n;
}

void ProcessGroup::pump(size_t index) {
  std::string chunk;
  entries_[index].process->read_output(&chunk);
  if (!chunk.empty()) entries_[index].output->write(chunk.data(), chunk.size());
}

void ProcessGroup::reap(std::vector<ExitEvent>* events) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    auto status = entries_[i].process->try_reap();
    if (!status) continue;
    remove_shm_segments_of(entries_[i].process->pid());
    pump(i);  // what it wrote before exiting (children holding the pipe may add more later)
    entries_[i].output->flush();
    events->push_back({i, *status, std::chrono::system_clock::now()});
  }
}

std::vector<ExitEvent> ProcessGroup::poll(double timeout_s) {
  std::vector<pollfd> fds;
  std::vector<size_t> owners;
  fds.push_back({wake_fd_, POLLIN, 0});
  for (size_t i = 0; i < entries_.size(); ++i) {
    int fd = entries_[i].process->output_fd();
    if (fd < 0) continue;
    fds.push_back({fd, POLLIN, 0});
    owners.push_back(i);
  }
  int timeout_ms = static_cast<int>(std::ceil(std::max(0.0, timeout_s) * 1000.0));
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n > 0) {
    for (size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents != 0) pump(owners[k - 1]);
  }
  // The wake pipe is drained by its owner (SignalRelay); reaping is cheap
  // enough to do on every pass, so a missed SIGCHLD costs one timeout at most.
  std::vector<ExitEvent> events;
  reap(&events);
  return events;
}

std::vector<ExitEvent> ProcessGroup::close(int first_signal, double grace_s,
                                           const std::function<bool()>& hurry) {
  std::vector<ExitEvent> events;
  for (auto& e : entries_) e.process->signal_group(first_signal);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (running() > 0 && std::chrono::steady_clock::now() < deadline && !(hurry && hurry())) {
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    auto got = poll(std::min(left, 0.05));
    events.insert(events.end(), got.begin(), got.end());
  }
  // SIGKILL the groups even when every leader is gone: grandchildren may be
  // left, in the leader's group or in others of its session.
  for (auto& e : entries_) e.process->signal_group(SIGKILL);
  signal_sessions(sessions(), SIGKILL);
  while (running() > 0) {
    if (hurry) hurry();  // drains the wake pipe, so this poll does not spin
    auto got = poll(0.02);
    events.insert(events.end(), got.begin(), got.end());
  }
  for (size_t i = 0; i < entries_.size(); ++i) pump(i);
  kill_sessions();  // what was still starting up when the first SIGKILL went out
  entries_.clear();
  return events;
}

}  // namespace dtrain::launcher
