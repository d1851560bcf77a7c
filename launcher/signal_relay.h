// The agent's wake-up channel: a self-pipe that SIGINT/SIGTERM/SIGCHLD
// handlers write one byte to (no other work in a handler), and that other
// threads (the heartbeat) poke with wake(); SIGPIPE is ignored meanwhile.
// Does not decide what to do.
#pragma once

namespace dtrain::launcher {

class SignalRelay {
 public:
  // Installs the handlers (one SignalRelay at a time per process).
  SignalRelay();
  // Restores the previous handlers and closes the pipe.
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Read end of the pipe: readable when something happened.
  int fd() const { return read_fd_; }
  // Empty the pipe (call after poll() said it is readable).
  void drain();
  // First SIGINT/SIGTERM received and not yet taken (0 = none).
  int take_stop_signal();
  // Wake the poller; async-signal-safe, callable from any thread.
  void wake();

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

}  // namespace dtrain::launcher
