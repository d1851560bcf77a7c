// RecordingProxy: a TCP proxy on 127.0.0.1:0 that forwards every connection
// to a target port and records every byte it passes, both ways: what a
// capture on the loopback between a client and a server would see. For the
// rendezvous' TLS tests; header-only, no test framework inside.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::testing {

class RecordingProxy {
 public:
  explicit RecordingProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = loopback(0);
    socklen_t len = sizeof addr;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 16);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  RecordingProxy(const RecordingProxy&) = delete;
  RecordingProxy& operator=(const RecordingProxy&) = delete;

  int port() const { return port_; }
  std::string recorded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  void accept_loop() {
    for (;;) {
      int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0 || stop_) {
        if (client >= 0) ::close(client);
        return;
      }
      int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr = loopback(target_port_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(server);
        ::close(client);
        continue;
      }
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }

  // Both directions of one connection until either side closes (or the
  // proxy stops: poll wakes every 50 ms to look).
  void pump(int a, int b) {
    char buf[16384];
    while (!stop_) {
      pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(fds, 2, 50) < 0) break;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) {
          closed = true;
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          bytes_.append(buf, static_cast<size_t>(n));
        }
        int to = i == 0 ? b : a;
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
          if (w <= 0) {
            closed = true;
            break;
          }
          off += w;
        }
      }
      if (closed) break;
    }
    ::close(a);
    ::close(b);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // touched by the acceptor thread only until joined
  mutable std::mutex mu_;
  std::string bytes_;
};

}  // namespace dtrain::testing
