// SignalRelay (see signal_relay.h). The handler state has to be global: a
// signal handler gets no context pointer. It is confined to this file.
#include "launcher/signal_relay.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace dtrain::launcher {

namespace {

volatile sig_atomic_t g_write_fd = -1;
volatile sig_atomic_t g_stop_signal = 0;

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};
struct sigaction g_previous[3];
struct sigaction g_previous_pipe;

void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD && g_stop_signal == 0) g_stop_signal = sig;
  if (g_write_fd >= 0) {
    char byte = static_cast<char>(sig);
    ssize_t n = ::write(g_write_fd, &byte, 1);  // full pipe: already readable, fine
    (void)n;
  }
  errno = saved;
}

}  // namespace

SignalRelay::SignalRelay() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(ErrorCode::internal, std::string("pipe2: ") + std::strerror(errno));
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_stop_signal = 0;
  g_write_fd = write_fd_;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) {
    int sig = kHandled[i];
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigaction(sig, &sa, &g_previous[i]);
  }
  // A closed console (dtrain ... | head) must not kill the agent and orphan
  // its workers: writes then fail with EPIPE instead.
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof ignore);
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &g_previous_pipe);
}

SignalRelay::~SignalRelay() {
  for (int i = 0; i < 3; ++i) sigaction(kHandled[i], &g_previous[i], nullptr);
  sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  g_write_fd = -1;
  ::close(read_fd_);
  ::close(write_fd_);
}

void SignalRelay::drain() {
  char buf[256];
  while (::read(read_fd_, buf, sizeof buf) > 0) {
  }
}

int SignalRelay::take_stop_signal() {
  int sig = g_stop_signal;
  g_stop_signal = 0;
  return sig;
}

void SignalRelay::wake() {
  char byte = 0;
  ssize_t n = ::write(write_fd_, &byte, 1);
  (void)n;
}

}  // namespace dtrain::launcher
