// wait_for_listener (store_wait.h): non-blocking connects, each given at most
// 200 ms (a cut link answers nothing: a blocking connect would wait for the
// kernel's SYN retries), 10 ms apart while refused.
#include "engine/comm/store_wait.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "engine/comm/round_abort.h"

namespace dtrain::engine::comm::detail {

namespace {

using Clock = std::chrono::steady_clock;

// One attempt: true when the connection was accepted within `limit`.
bool try_connect(const addrinfo& ai, std::chrono::milliseconds limit) {
  const int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return false;
  bool ok = ::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

bool wait_for_listener(const std::string& host, int port, Clock::time_point until) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return false;
  bool up = false;
  while (!up && !round_aborted()) {
    for (const addrinfo* ai = found; ai && !up; ai = ai->ai_next) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      up = try_connect(*ai, std::min(left, std::chrono::milliseconds(200)));
    }
    if (up || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::freeaddrinfo(found);
  return up;
}

}  // namespace dtrain::engine::comm::detail
